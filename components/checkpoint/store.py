"""Checkpoints on any fsspec URL: commit protocol, ``LATEST`` pointer, pruning, verified restore, on the project's
one storage layer (:mod:`components.storage`: transport, retries, errors, redaction).

Layout under the store URI (a local path, ``file://``, ``s3://bucket/prefix``, ``hdfs://``, ``webhdfs://``,
``memory://``, ...)::

    <uri>/<ckpt_id>/tables/NNN/part-*.gz  ...    the checkpoint's files, uploaded in any order
    <uri>/<ckpt_id>/model.json                   the checkpoint's meta (written by :meth:`CheckpointStore.commit`)
    <uri>/<ckpt_id>/MANIFEST.json                written LAST: every file with size and sha256
    <uri>/LATEST                                 ``{"id": <ckpt_id>}``, moved only after a manifest is written
    <uri>/BEST                                   ``{"id": <ckpt_id>}``: the best on the validation split, if any

A checkpoint directory without ``MANIFEST.json`` is invisible: it is never listed as committed, never
resolved, never downloaded, and :meth:`CheckpointStore.cleanup_incomplete` removes it. So an upload that dies
half way (pod killed, endpoint gone) leaves nothing a reader could pick up.

Checkpoint ids are made by :func:`make_id` (``<UTC time to the microsecond>Z-e<epoch>-s<step>``): they sort
in creation order, which is what :meth:`CheckpointStore.committed`, :meth:`CheckpointStore.latest` (when
``LATEST`` is unusable) and :meth:`CheckpointStore.prune` rely on, so the store writes no other ids, and it
never deletes a directory whose name is not such an id (a store URI pointed at a shared prefix cannot wipe
foreign data).

Every remote operation is retried on transient errors (:mod:`components.storage`); when the tries run out it
raises :class:`CheckpointStoreError` naming the file and URL, and what no wait fixes (a full disk, no permission,
no credentials) raises :class:`StoreRefused` at once, naming the cause; a malformed name or content raises
:class:`~components.checkpoint.format.CheckpointError`.

Every file is hashed while it is uploaded (one read of the local file), and checked against the manifest
(size and sha256) when it is downloaded. A downloaded checkpoint directory holds ``MANIFEST.json`` and
``model.json`` (the store's manifest, byte for byte), so :func:`components.checkpoint.format.load` / ``verify``
read it like a locally committed one.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

from components.checkpoint.format import (MANIFEST, MODEL_META, CheckpointError, checkpoint_file,
                                          file_digest)
from components.storage import SMALL_FILE, Storage, StorageError, StorageRefused

log = logging.getLogger(__name__)

LATEST = "LATEST"
BEST = "BEST"
FORMAT = 1
ID_RE = re.compile(r"^(?P<time>\d{8}T\d{12})Z-e(?P<epoch>\d{4,})-s(?P<step>\d{10,})$")
_id_lock = threading.Lock()
_last_id_us = 0


class CheckpointStoreError(CheckpointError, StorageError):
    """A transport failure (after retries) or an unusable store URI; names the file and URL, never credentials."""


class StoreRefused(CheckpointStoreError, StorageRefused):
    """The store refused an operation for a reason no retry fixes: no space left, no permission, no credentials, no
    such file or bucket."""


def make_id(epoch: int, step: int, *, now: _dt.datetime | None = None) -> str:
    """A checkpoint id that sorts in creation order: ``20261129T163935123456Z-e0003-s0000001200``.

    Within a process ids are strictly increasing even if the clock stalls or steps back.
    """
    global _last_id_us
    if epoch < 0 or step < 0:
        raise ValueError(f"make_id: epoch and step must be >= 0, got {epoch}, {step}")
    now = (now or _dt.datetime.now(_dt.timezone.utc)).astimezone(_dt.timezone.utc)
    micros = int((now - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)) / _dt.timedelta(microseconds=1))
    with _id_lock:
        micros = max(micros, _last_id_us + 1)
        _last_id_us = micros
    stamp = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc) + _dt.timedelta(microseconds=micros)
    return f"{stamp:%Y%m%dT%H%M%S}{stamp.microsecond:06d}Z-e{epoch:04d}-s{step:010d}"


def _match_id(ckpt_id: Any) -> re.Match:
    match = ID_RE.match(ckpt_id) if isinstance(ckpt_id, str) else None
    if match is None:
        raise ValueError(f"{ckpt_id!r} is not a checkpoint id (made by make_id)")
    return match


def parse_id(ckpt_id: str) -> tuple[int, int]:
    """``(epoch, step)`` of an id made by :func:`make_id`."""
    match = _match_id(ckpt_id)
    return int(match["epoch"]), int(match["step"])


def id_time(ckpt_id: str) -> _dt.datetime:
    """When :func:`make_id` made the id (UTC, to the microsecond)."""
    stamp = _dt.datetime.strptime(_match_id(ckpt_id)["time"], "%Y%m%dT%H%M%S%f")
    return stamp.replace(tzinfo=_dt.timezone.utc)


class CheckpointStore(Storage):
    """Checkpoints under one fsspec URL (:class:`~components.storage.Storage`: ``retries``, ``backoff_s``,
    ``storage_options``, ``workers``). Single writer; any number of readers."""

    Error = CheckpointStoreError
    Refused = StoreRefused
    Invalid = CheckpointError
    what = "checkpoint store"
    within = "a checkpoint"

    @staticmethod
    def _check_new_id(ckpt_id: str) -> str:
        if not isinstance(ckpt_id, str) or not ID_RE.match(ckpt_id):
            raise CheckpointError(f"checkpoint id {ckpt_id!r} was not made by make_id(epoch, step): the store "
                                  "writes only ids that sort in creation order")
        return ckpt_id

    def upload_file(self, local: str | os.PathLike, ckpt_id: str, rel: str) -> dict[str, Any]:
        """Send one file to ``<uri>/<ckpt_id>/<rel>``; returns ``{"size", "sha256"}`` of the bytes sent."""
        local = Path(local)
        self._check_new_id(ckpt_id)
        rel = self._check_rel(rel)
        if rel == MANIFEST:
            raise CheckpointError(f"{MANIFEST} is written by commit(), never uploaded: it makes the checkpoint "
                                  "visible")
        if not local.is_file():
            raise CheckpointError(f"cannot upload {local}: not a file")
        return self.send_file(local, ckpt_id, rel)

    def upload_dir(self, local_dir: str | os.PathLike, ckpt_id: str, prefix: str = "") -> dict[str, dict[str, Any]]:
        """Send every file under ``local_dir`` (``workers`` at once) to ``<uri>/<ckpt_id>/<prefix>/...``.

        Returns ``rel path -> {"size", "sha256"}``, the ``files`` for :meth:`commit`. A top-level
        ``MANIFEST.json`` in ``local_dir`` is skipped (only :meth:`commit` writes one). On the first failure
        the files not started yet are dropped and the error is raised; nothing becomes visible.
        """
        local_dir = Path(local_dir)
        self._check_new_id(ckpt_id)
        if not local_dir.is_dir():
            raise CheckpointError(f"cannot upload {local_dir}: not a directory")
        if self._has_manifest(ckpt_id):
            raise CheckpointError(f"{self.url(ckpt_id)} is already committed: a checkpoint is never changed "
                                  "after its manifest is written (make a new id with make_id)")
        prefix = self._check_rel(prefix) + "/" if prefix.strip("/") else ""
        jobs = []
        for p in sorted(local_dir.rglob("*")):
            if not p.is_file():
                continue
            rel = prefix + p.relative_to(local_dir).as_posix()
            if rel == MANIFEST:
                log.info("not uploading %s: the store writes its own %s at commit", p, MANIFEST)
                continue
            jobs.append((p, rel))
        return self._parallel([(rel, (lambda p=p, rel=rel: self.upload_file(p, ckpt_id, rel))) for p, rel in jobs])

    def list_files(self, ckpt_id: str, prefix: str = "") -> list[str]:
        """Relative names of the files stored under ``<uri>/<ckpt_id>/<prefix>`` (committed or not)."""
        return sorted(self.stored_sizes(ckpt_id, prefix))

    def commit(self, ckpt_id: str, files: dict[str, dict[str, Any]], meta: dict[str, Any], *,
               set_latest: bool = True) -> dict[str, Any]:
        """Make an uploaded checkpoint visible: ``model.json`` (meta), then the manifest, then ``LATEST``.

        ``files`` are the uploads' entries (:meth:`upload_dir` / :meth:`upload_file`). Before the manifest is
        written every file in it is checked to be in the store with its size, so a manifest never names a
        file that did not land. Returns the manifest.
        """
        self._check_new_id(ckpt_id)
        files = {self._check_rel(rel): {"size": int(e["size"]), "sha256": str(e["sha256"])} for rel, e in files.items()}
        files.pop(MANIFEST, None)
        files[MODEL_META] = self.write_json(ckpt_id, MODEL_META, meta)
        stored = self.stored_sizes(ckpt_id)
        for rel, entry in sorted(files.items()):
            if rel not in stored:
                raise CheckpointStoreError(f"cannot commit {self.url(ckpt_id)}: {self.url(ckpt_id, rel)} was "
                                           "not uploaded")
            if stored[rel] != entry["size"]:
                raise CheckpointStoreError(f"cannot commit {self.url(ckpt_id)}: {self.url(ckpt_id, rel)} holds "
                                           f"{stored[rel]} bytes, the upload sent {entry['size']}")
        summary = {k: v for k, v in meta.items() if v is None or isinstance(v, (str, int, float, bool))}
        manifest = {
            "format": FORMAT,
            "id": ckpt_id,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "paddle_version": meta.get("paddle_version"),
            "meta": summary,
            "files": dict(sorted(files.items())),
        }
        self.write_json(ckpt_id, MANIFEST, manifest)
        if set_latest:
            self.write_json(None, LATEST, {"id": ckpt_id})
        log.info("committed checkpoint %s (%d files, %d bytes)", self.url(ckpt_id), len(files),
                 sum(e["size"] for e in files.values()))
        return manifest

    def _ids(self) -> list[str]:
        """Names of the checkpoint directories (made by :func:`make_id`), committed or not, sorted."""
        names = {e["name"].rstrip("/").rsplit("/", 1)[-1] for e in self.list_dir() if e.get("type") == "directory"}
        return sorted(n for n in names if ID_RE.match(n))

    def _has_manifest(self, ckpt_id: str) -> bool:
        # not fs.isfile/exists: an endpoint that is down would make every checkpoint look incomplete (and
        # cleanup_incomplete delete it)
        return self.is_file(ckpt_id, MANIFEST)

    def committed(self) -> list[str]:
        """Ids of the committed checkpoints (those with a manifest), oldest first."""
        return [i for i in self._ids() if self._has_manifest(i)]

    def latest(self) -> str | None:
        """The id ``LATEST`` names if that checkpoint is committed, else the newest committed one, else None."""
        ids = self.committed()
        if not ids:
            return None
        try:
            pointer = self.read_json(None, LATEST)
        except CheckpointStoreError:
            raise
        except CheckpointError as e:
            log.warning("ignoring %s: %s", self.url(None, LATEST), e)
            pointer = None
        named = pointer.get("id") if isinstance(pointer, dict) else None
        if named in ids:
            return named
        if named is not None:
            log.warning("%s names %r, which is not a committed checkpoint; using the newest committed, %s",
                        self.url(None, LATEST), named, ids[-1])
        return ids[-1]

    def resolve(self, resume: str | None) -> str | None:
        """``"none"`` -> None; ``"latest"`` -> :meth:`latest`; ``"auto"`` -> :meth:`latest`, or None on a store
        with no committed checkpoint; an id -> that id.

        ``latest`` on a store with no committed checkpoint, or an id that is not committed, raises
        :class:`CheckpointError` (listing the committed ids): a resume that cannot resume must not quietly
        train from scratch.
        """
        key = (resume or "none").strip()
        if key.lower() == "none":
            return None
        if key.lower() in ("latest", "auto"):
            latest = self.latest()
            if latest is None and key.lower() == "latest":
                raise CheckpointError(f"{self.display_uri} holds no committed checkpoint to resume (latest): point "
                                      "checkpoint.uri at the store of the run to continue, or use "
                                      "checkpoint.resume=auto to start fresh when the store is empty")
            return latest
        ids = self.committed()
        if key in ids:
            return key
        raise CheckpointError(f"checkpoint {key!r} is not a committed checkpoint in {self.display_uri}; "
                              f"committed: {', '.join(ids) if ids else '(none)'}")

    def _delete(self, ckpt_id: str) -> None:
        """Remove a checkpoint directory: its manifest first, so a half-done delete leaves nothing visible."""
        manifest = self.fs_path(ckpt_id, MANIFEST)

        def rm_manifest() -> None:
            try:
                self.fs.rm_file(manifest)
            except FileNotFoundError:
                pass

        def rm_dir() -> None:
            try:
                self.fs.rm(self.fs_path(ckpt_id), recursive=True)
            except FileNotFoundError:
                pass

        self._retry(f"deleting {self.url(ckpt_id, MANIFEST)}", rm_manifest)
        self._retry(f"deleting {self.url(ckpt_id)}", rm_dir)
        self.fs.invalidate_cache()

    def best(self) -> str | None:
        """The committed checkpoint ``BEST`` names (the best on the validation split), else None."""
        pointer = self.read_json(None, BEST)
        named = pointer.get("id") if isinstance(pointer, dict) else None
        return named if named is not None and self._has_manifest(named) else None

    def mark_best(self, ckpt_id: str) -> None:
        """Point ``BEST`` at a committed checkpoint: pruning keeps it."""
        if not self._has_manifest(ckpt_id):
            raise CheckpointError(f"{self.url(ckpt_id)} is not committed: it cannot be the best")
        self.write_json(None, BEST, {"id": ckpt_id})

    def prune(self, keep_last: int) -> list[str]:
        """Delete the oldest committed checkpoints beyond the newest ``keep_last``, never the ones ``LATEST`` and
        ``BEST`` name; returns the deleted ids."""
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        ids = self.committed()
        keep = {self.latest(), self.best()}
        victims = [i for i in ids[:-keep_last] if i not in keep]
        for ckpt_id in victims:
            self._delete(ckpt_id)
            log.info("pruned checkpoint %s", self.url(ckpt_id))
        return victims

    def cleanup_incomplete(self, keep: Iterable[str] = ()) -> list[str]:
        """Delete checkpoint directories without a manifest (failed saves), except those in ``keep``
        (saves in progress); returns the deleted ids."""
        keep = set(keep)
        victims = [i for i in self._ids() if i not in keep and not self._has_manifest(i)]
        for ckpt_id in victims:
            self._delete(ckpt_id)
            log.info("removed incomplete checkpoint %s", self.url(ckpt_id))
        return victims

    def manifest(self, ckpt_id: str) -> dict[str, Any]:
        """The manifest of a committed checkpoint; :class:`CheckpointError` listing the committed ids if none."""
        return self._manifest(ckpt_id)[0]

    def _manifest(self, ckpt_id: str) -> tuple[dict[str, Any], bytes]:
        manifest, raw = self._read_json(ckpt_id, MANIFEST)
        if manifest is None:
            ids = self.committed()
            raise CheckpointError(f"{self.url(ckpt_id)} is not a committed checkpoint (no {MANIFEST}); "
                                  f"committed: {', '.join(ids) if ids else '(none)'}")
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise CheckpointError(f"{self.url(ckpt_id, MANIFEST)} has no file list: altered")
        return manifest, raw

    def _get_once(self, path: str, tmp: Path, url: str, size: int) -> tuple[int, str]:
        """One try at fetching ``path`` into ``tmp``; returns the size and sha256 of what arrived."""
        tmp.parent.mkdir(parents=True, exist_ok=True)
        try:
            if size <= SMALL_FILE:  # one GET into memory, hashed there: the local copy is never read back
                data = self.fs.cat_file(path)
                tmp.write_bytes(data)
                return len(data), hashlib.sha256(data).hexdigest()
            self.fs.get_file(path, str(tmp))  # streamed to disk; hashed from the page cache
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint file {url} listed in {MANIFEST} is missing") from None
        return file_digest(tmp)

    def _download_file(self, ckpt_id: str, rel: str, expected: dict[str, Any], local_dir: Path) -> None:
        target = checkpoint_file(local_dir, rel)
        tmp = target.with_name(f".{target.name}.part")
        url = self.url(ckpt_id, rel)
        path = self.fs_path(ckpt_id, rel)
        try:
            size, sha = self._retry(f"downloading {url} to {target}",
                                    lambda: self._get_once(path, tmp, url, int(expected["size"])))
        except CheckpointError:
            tmp.unlink(missing_ok=True)
            raise
        if size != expected["size"] or sha != expected["sha256"]:
            tmp.unlink(missing_ok=True)
            what = (f"{size} bytes, {MANIFEST} says {expected['size']}" if size != expected["size"]
                    else "sha256 differs")
            raise CheckpointError(f"checkpoint file {url} does not match {MANIFEST} ({what}): truncated or altered")
        os.replace(tmp, target)

    def download(self, ckpt_id: str, local_dir: str | os.PathLike,
                 select: Callable[[str], bool] | None = None) -> Path:
        """Fetch a committed checkpoint into ``local_dir`` and verify every file's size and sha256.

        ``select(rel)`` picks files (``model.json`` always comes). The store's ``MANIFEST.json`` is written
        last, byte for byte (its sha256 identifies the checkpoint), so the directory is a local checkpoint for
        :mod:`components.checkpoint.format`; after a ``select`` it lists files that were not fetched (check only
        the parts fetched). A file that does not match raises :class:`CheckpointError` naming it.
        """
        local_dir = Path(local_dir)
        manifest, raw = self._manifest(ckpt_id)
        files = {self._check_rel(rel): e for rel, e in manifest["files"].items()
                 if rel == MODEL_META or select is None or select(rel)}
        local_dir.mkdir(parents=True, exist_ok=True)
        (local_dir / MANIFEST).unlink(missing_ok=True)  # a stale one must not vouch for a half-done download
        self._parallel([(rel, (lambda rel=rel, e=e: self._download_file(ckpt_id, rel, e, local_dir)))
                        for rel, e in sorted(files.items())])
        tmp = local_dir / f".{MANIFEST}.tmp"
        tmp.write_bytes(raw)
        os.replace(tmp, local_dir / MANIFEST)
        return local_dir

    def missing(self, url: str) -> Exception:
        return CheckpointError(f"checkpoint file {url} listed in {MANIFEST} is missing")
