"""Whether a committed checkpoint is whole, checked before a job starts from it (:mod:`components.checkpoint.restore`).

A checkpoint is intact when its ``MANIFEST.json`` reads as a manifest of that checkpoint, and every file it lists
is in the store with its size and its sha256. Everything is checked, the table files' sha256 included, before any
work starts (the driver's and the resolve step's checks run before data prep, the train step's before any PS
process): one changed byte in a table file keeps the file's size, so sizes alone would let it through to the
servers, whose verified download then ends the job after data prep with nothing to fall back to.

What that costs, measured on this machine (2 shared cores, 2026-12-04): a 300 MB checkpoint (8 table files of
37.5 MB) is checked whole in 0.18-0.22 s on a local store (sha256 at about 1.4 GB/s with the CPU's SHA extensions)
and in 1.3-1.6 s from S3 on loopback (moto; its files read ``store.workers`` at once: as one 300 MB file, 4.4 s);
the checkpoints of this project's real Criteo runs are 15-22 MB. That is small next to a job's start (a tiny
local run takes 20 s), so nothing is deferred: each check reads the checkpoint once (a local run checks in the
driver, the resolve step and the train step; a Kubeflow run in the resolve and the train step), besides the
servers' own verified download of the tables.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Iterable, Optional

from components.checkpoint.format import MANIFEST, CheckpointError

if TYPE_CHECKING:
    from components.checkpoint.store import CheckpointStore


def checkpoint_problem(store: "CheckpointStore", ckpt_id: str) -> Optional[str]:
    """What is wrong with committed checkpoint ``ckpt_id`` in one phrase (the file and how it differs), or None
    when it is intact. A store that cannot be read raises :class:`CheckpointStoreError`: that is no corruption."""
    from components.checkpoint.store import CheckpointStoreError

    try:
        manifest = store.manifest(ckpt_id)
    except CheckpointStoreError:
        raise
    except CheckpointError as err:
        return str(err)
    if manifest.get("id", ckpt_id) != ckpt_id:
        return f"{MANIFEST} is the manifest of checkpoint {manifest.get('id')!r}"
    try:
        files = {rel: (int(entry["size"]), str(entry["sha256"])) for rel, entry in manifest["files"].items()}
    except (KeyError, TypeError, ValueError):
        return f"{MANIFEST} lists a file without its size and sha256: altered"
    stored = store.stored_sizes(ckpt_id)
    for rel, (size, _) in sorted(files.items()):
        if rel not in stored:
            return f"{rel}, listed in {MANIFEST}, is missing"
        if stored[rel] != size:
            return f"{rel} holds {stored[rel]:,} bytes, {MANIFEST} says {size:,}: truncated or altered"
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(store.workers, len(files))),
                                thread_name_prefix="ckpt-verify") as pool:
            digests = dict(zip(sorted(files), pool.map(lambda rel: store.digest(ckpt_id, rel), sorted(files))))
    except CheckpointStoreError:
        raise
    except CheckpointError as err:  # a file gone since the listing
        return str(err)
    for rel, (size, sha) in sorted(files.items()):
        if digests[rel] != (size, sha):
            return f"{rel} does not match its sha256 in {MANIFEST}: altered"
    return None


def newest_intact(store: "CheckpointStore", candidates: Iterable[str]) -> tuple[Optional[str], list[tuple[str, str]]]:
    """``(the first intact checkpoint of candidates (newest first), [(id, problem) of those skipped before it])``;
    the first is None when none is intact."""
    skipped = []
    for ckpt_id in candidates:
        problem = checkpoint_problem(store, ckpt_id)
        if problem is None:
            return ckpt_id, skipped
        skipped.append((ckpt_id, problem))
    return None, skipped


def describe_skipped(store: "CheckpointStore", skipped: list[tuple[str, str]]) -> str:
    """``checkpoint <id> in <store> is corrupt (<problem>)`` for one or more, in one line."""
    if len(skipped) == 1:
        return f"checkpoint {skipped[0][0]} in {store.display_uri} is corrupt ({skipped[0][1]})"
    listed = ", ".join(f"{ckpt_id} ({problem})" for ckpt_id, problem in skipped)
    return f"checkpoints {listed} in {store.display_uri} are corrupt"
