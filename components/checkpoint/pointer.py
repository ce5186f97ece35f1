"""The pointer a ``Model`` artifact carries to its checkpoint.

The train step does not copy the checkpoint into the artifact store: the job writes it to ``checkpoint.uri``,
and the ``Model`` artifact only points at it: ``metadata["uri"]`` / ``metadata["id"]`` and a small JSON
pointer file at the artifact's path (:func:`read_pointer` reads either). The steps after training fetch
what they score from there (:func:`fetched_checkpoint`; :func:`fetch_file` for one file at a time).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator, Optional

from components.checkpoint.format import SCORING_PARTS, checkpoint_file
from components.checkpoint.store import CheckpointStore

POINTER_FORMAT = 1


def write_pointer(path: str | os.PathLike, summary: dict) -> None:
    """The pointer file: ``summary`` holds at least the store ``uri`` and the checkpoint ``id``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"format": POINTER_FORMAT, **summary}, indent=2, sort_keys=True))


def read_pointer(path: str | os.PathLike, metadata: Optional[dict] = None) -> tuple[str, str]:
    """``(store uri, checkpoint id)`` a ``Model`` artifact points at: its metadata, else its pointer file."""
    pointer = metadata if metadata and metadata.get("uri") else json.loads(Path(path).read_text())
    return str(pointer["uri"]), str(pointer["id"])


def fetch_for_scoring(uri: str, ckpt_id: str, local_dir: str | os.PathLike,
                      parts: tuple[str, ...] = SCORING_PARTS) -> Path:
    """The files of a committed checkpoint under ``parts`` (by default its export and model.json), verified, in
    ``local_dir`` (the tables stay put)."""
    return CheckpointStore(uri).download(ckpt_id, local_dir, select=lambda rel: rel.startswith(parts))


def fetch_file(uri: str, ckpt_id: str, rel: str, local_dir: str | os.PathLike) -> Path:
    """One file of a committed checkpoint, verified, at ``local_dir / rel`` (``model.json`` and the manifest come
    too): how a reader that must not hold the whole checkpoint, the serving export reading the table one shard
    file at a time, fetches it."""
    CheckpointStore(uri).download(ckpt_id, local_dir, select=lambda name: name == rel)
    return checkpoint_file(local_dir, rel)


@contextlib.contextmanager
def fetched_checkpoint(path: str | os.PathLike, metadata: Optional[dict] = None,
                       parts: tuple[str, ...] = SCORING_PARTS) -> Iterator[tuple[str, str, Path]]:
    """``(store uri, checkpoint id, local dir)`` of the checkpoint a ``Model`` artifact points at, its files under
    ``parts`` fetched (verified) into a scratch directory that lives as long as the ``with`` block."""
    uri, ckpt_id = read_pointer(path, metadata)
    with tempfile.TemporaryDirectory() as scratch:
        yield uri, ckpt_id, fetch_for_scoring(uri, ckpt_id, Path(scratch) / ckpt_id, parts)
