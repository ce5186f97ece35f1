"""Delta exports: a version that writes only what changed since its parent, shard by shard.

A delta's shard holds the rows whose id is new or whose stored value changed (bit for bit, in export.dtype)
since the parent version, and tombstones: the ids the parent holds and the new checkpoint does not (evicted).
Computing it compares the new checkpoint's shard with the parent's shard rebuilt from its chain (the base's
shard, then each delta's in order): two sorted id arrays merged with ``searchsorted``, one shard in memory at
a time, never the whole table. Base + deltas rebuild the newest full export exactly (:func:`rebuilt_shard`).

When the next export is a delta and when a base is :func:`plan_version`'s rule: a base first, after
``export.base_every`` deltas, with ``base_every`` 0, and when the parent is laid out differently (shard count,
row width or dtype, schema), since its rows could not be compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from components.export.manifest import verify_file
from components.export.shards import IDS, ROWS, TOMBSTONES, ShardLayer, positions, shard_files
from components.export.store import ExportStore

BASE, DELTA = "base", "delta"
# What must be the same in a delta and its parent for its rows to be compared and applied.
LAYOUT_KEYS = ("shard_num", "embedding_dim", "embedding_dtype", "schema")


@dataclass
class VersionPlan:
    version: int
    kind: str  # base or delta
    parent: Optional[int]  # None for a base
    chain: list[int]  # the versions a loader applies in order: the base, then each delta up to this one


def plan_version(parent: Optional[dict[str, Any]], base_every: int, layout: dict[str, Any]) -> VersionPlan:
    """The next version after the published ``parent`` manifest (None: the store is empty)."""
    if parent is None:
        return VersionPlan(1, BASE, None, [1])
    version = parent["version"] + 1
    deltas = len(parent["chain"]) - 1
    if base_every == 0 or deltas >= base_every or any(parent.get(key) != layout[key] for key in LAYOUT_KEYS):
        return VersionPlan(version, BASE, None, [version])
    return VersionPlan(version, DELTA, parent["version"], [*parent["chain"], version])


def diff_shard(parent_ids: np.ndarray, parent_rows: np.ndarray, ids: np.ndarray,
               rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, rows, tombstones)`` that turn the parent's shard into the new one (both sorted, rows in one dtype)."""
    found, pos = positions(parent_ids, ids)
    changed = ~found
    bits = np.dtype(f"u{rows.dtype.itemsize}")  # compare bit patterns: exact, and NaN equals itself
    same = np.ascontiguousarray(rows[found]).view(bits) == np.ascontiguousarray(parent_rows[pos[found]]).view(bits)
    changed[found] = ~same.all(axis=1)
    kept = np.zeros(len(parent_ids), bool)
    kept[pos[found]] = True
    return ids[changed], rows[changed], np.asarray(parent_ids[~kept], np.uint64)


def apply_shard_delta(ids: np.ndarray, rows: np.ndarray, layer: ShardLayer) -> tuple[np.ndarray, np.ndarray]:
    """A shard after ``layer``: its tombstones and rewritten ids dropped, its rows merged in, sorted by id."""
    dropped = positions(layer.tombstones, ids)[0] | positions(layer.ids, ids)[0]
    merged_ids = np.concatenate([ids[~dropped], layer.ids])
    order = np.argsort(merged_ids, kind="stable")
    return merged_ids[order], np.concatenate([rows[~dropped], np.asarray(layer.rows)])[order]


def rebuilt_shard(store: ExportStore, manifests: list[dict[str, Any]], index: int) -> tuple[np.ndarray, np.ndarray]:
    """Shard ``index`` of the last of ``manifests`` (a chain: its base, then its deltas in order), in memory,
    every file checked against its manifest."""
    base = _read_layer(store, manifests[0], index)
    ids, rows = base.ids, base.rows
    for manifest in manifests[1:]:
        ids, rows = apply_shard_delta(ids, rows, _read_layer(store, manifest, index))
    return ids, rows


def _read_layer(store: ExportStore, manifest: dict[str, Any], index: int) -> ShardLayer:
    files = shard_files(index, manifest["kind"] == DELTA)
    arrays = {}
    for kind, rel in files.items():
        with store.fetched(manifest["version"], rel) as path:
            verify_file(Path(path), manifest["files"][rel])
            arrays[kind] = np.load(path)
    return ShardLayer(arrays[IDS], arrays[ROWS], arrays.get(TOMBSTONES, np.zeros(0, np.uint64)))
