"""A sharded version's embedding rows: one set of files per table shard, looked up per batch from memory maps.

Shard ``s`` of a version (``s`` = the table shard, ``id % shard_num``) is::

    shards/SSSSS.ids.npy         uint64 [n], sorted: the ids whose rows the version writes
    shards/SSSSS.rows.npy        [n, embedding_dim] in export.dtype (float32 or float16): row i is ids[i]'s
    shards/SSSSS.tombstones.npy  a delta only: uint64, sorted: ids the version removes (evicted since its parent)

A base writes every row of the shard; a delta the rows new or changed since its parent, and the tombstones
(:mod:`components.export.delta`). :class:`ShardedTable` holds, per shard, the base's files and each applied
delta's as memory-mapped layers, newest first: an id's row is the newest layer's that writes it, unless that
layer (or a newer one) removed it; an id no layer holds gets a zero row, as the single-file model's unseen ids.
Memory follows the rows a batch touches, not the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from components.config import ExportDtype
from components.export.manifest import local_file

SHARDS = "shards"
IDS, ROWS, TOMBSTONES = "ids", "rows", "tombstones"


def shard_files(index: int, delta: bool) -> dict[str, str]:
    """The files of shard ``index``, by kind, relative to the version directory."""
    kinds = (IDS, ROWS, TOMBSTONES) if delta else (IDS, ROWS)
    return {kind: f"{SHARDS}/{index:05d}.{kind}.npy" for kind in kinds}


def narrowed(rows: np.ndarray, dtype: ExportDtype) -> np.ndarray:
    """``rows`` as ``dtype``; raises ValueError when a finite value does not fit (float16 ends at 65504)."""
    with np.errstate(over="ignore"):  # overflow is reported below, naming the values
        stored = np.ascontiguousarray(rows, dtype=dtype.value)
    overflow = np.isfinite(rows) & ~np.isfinite(stored)
    if overflow.any():
        raise ValueError(f"embedding values up to {np.abs(rows[overflow]).max():.6g} do not fit export.dtype="
                         f"{dtype.value} (largest finite value {np.finfo(stored.dtype).max:.6g}): export float32 "
                         "or narrow table.weight_bounds")
    return stored


def write_shard(root: Path, index: int, ids: np.ndarray, rows: np.ndarray,
                tombstones: Optional[np.ndarray] = None) -> dict[str, Any]:
    """Write shard ``index`` (``tombstones``: a delta's) under ``root``; returns its ``serving.json`` entry."""
    files = shard_files(index, tombstones is not None)
    (root / SHARDS).mkdir(exist_ok=True)
    np.save(root / files[IDS], np.asarray(ids, np.uint64))
    np.save(root / files[ROWS], rows)
    entry: dict[str, Any] = {**files, "written": int(len(ids))}
    if tombstones is not None:
        np.save(root / files[TOMBSTONES], np.asarray(tombstones, np.uint64))
        entry["removed"] = int(len(tombstones))
    return entry


@dataclass
class ShardLayer:
    """One version's files of one shard (memory-mapped, or read into memory)."""

    ids: np.ndarray
    rows: np.ndarray
    tombstones: np.ndarray

    @classmethod
    def read(cls, paths: dict[str, Path], mmap: bool = True) -> ShardLayer:
        """The layer of files ``paths`` (by kind, as :func:`shard_files`; a base has no tombstones)."""
        mode = "r" if mmap else None
        tombstones = (np.load(paths[TOMBSTONES], mmap_mode=mode) if TOMBSTONES in paths
                      else np.zeros(0, np.uint64))
        return cls(np.load(paths[IDS], mmap_mode=mode), np.load(paths[ROWS], mmap_mode=mode), tombstones)


def positions(sorted_ids: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(found, position)`` of each of ``ids`` in ``sorted_ids`` (position meaningful where found)."""
    if not len(sorted_ids):
        return np.zeros(len(ids), bool), np.zeros(len(ids), np.int64)
    pos = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return sorted_ids[pos] == ids, pos


class ShardedTable:
    """Rows looked up per batch in ``shard_num`` shards of ``dim`` wide rows, each a stack of layers."""

    def __init__(self, shard_num: int, dim: int):
        self.shard_num, self.dim = shard_num, dim
        self.layers: list[list[ShardLayer]] = [[] for _ in range(shard_num)]

    def copy(self) -> ShardedTable:
        """A table sharing this one's layers (their memory maps); pushing onto it leaves this one as it is."""
        table = ShardedTable(self.shard_num, self.dim)
        table.layers = [list(layers) for layers in self.layers]
        return table

    def push(self, root: Path, manifest: dict[str, Any]) -> None:
        """Add the version at ``root``: a base replaces every layer, a delta goes on top. The file names come
        from ``serving.json``: each must stay inside ``root``."""
        delta = manifest["kind"] == "delta"
        for index, entry in enumerate(manifest["shards"]):
            layer = ShardLayer.read({kind: local_file(root, entry[kind]) for kind in shard_files(index, delta)})
            self.layers[index] = [*self.layers[index], layer] if delta else [layer]

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """float32 ``[len(ids), dim]``: each id's row (float16 rows widened, exactly), zeros for ids no layer holds."""
        ids = np.asarray(ids).astype(np.uint64)
        out = np.zeros((len(ids), self.dim), np.float32)
        shard_of = ids % np.uint64(self.shard_num)
        order = np.argsort(shard_of, kind="stable")
        bounds = np.searchsorted(shard_of[order], np.arange(self.shard_num + 1, dtype=np.uint64))
        for index in np.flatnonzero(np.diff(bounds)):
            picked = order[bounds[index]:bounds[index + 1]]
            out[picked] = self._shard_rows(self.layers[index], ids[picked])
        return out

    def _shard_rows(self, layers: list[ShardLayer], ids: np.ndarray) -> np.ndarray:
        rows = np.zeros((len(ids), self.dim), np.float32)
        pending = np.ones(len(ids), bool)
        for layer in reversed(layers):  # newest first
            asked = np.flatnonzero(pending)
            found, pos = positions(layer.ids, ids[asked])
            rows[asked[found]] = layer.rows[pos[found]]
            removed = positions(layer.tombstones, ids[asked])[0] & ~found
            pending[asked[found | removed]] = False
            if not pending.any():
                break
        return rows
