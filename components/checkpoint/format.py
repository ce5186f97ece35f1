"""Checkpoint layout, manifest and the portable export of a trained PS model.

A checkpoint directory holds::

    tables/NNN/part-SSS-XXXXX  the servers' own table files (fleet.save_persistables), one per shard, written by
                             every server in parallel: what a PS job reloads to resume and what the serving
                             export converts, shard by shard (checkpoints before 2026-12 hold ``.gz`` files)
    export/dense.npz         every dense parameter by name (float32)
    export/embedding.npz     only when the servers cannot save their table (geo, SSD: see
                             :func:`components.checkpoint.protocol.rows_from_workers`): ids (uint64, sorted) and
                             rows ([n, dim] float32) the workers pulled
    scores/valid.npz         the checkpoint's predictions on the validation and test splits, scored through the
    scores/test.npz          servers by every worker and merged (:class:`components.metrics.ScoreCounts`): what
    scores/test-calibrated.npz  validation and evaluation compute their metrics from; the calibrated ones (when
                             the checkpoint carries a calibration) by the program that applies it as the served
                             model does
    scores/test-rows/worker-NNNNN.npz  only with eval.group_by or eval.slices: each worker's per-row test
                             predictions (:class:`RowPredictions`), what the per-group metrics need
    model.json               what rebuilds the network: model config, data schema, table config (shard_num),
                             the sparse table's directory (``sparse_table``), mode, Paddle version, server count
    MANIFEST.json            written last: every file with size and sha256

A directory without ``MANIFEST.json`` is not a checkpoint: it is never loaded. Files are checked against
the manifest at load, so a truncated or altered file is reported by name. Where checkpoints live (any
fsspec store) and how they get there is :mod:`components.checkpoint.store`; this module is the format.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from components.config import ExportDtype
from components.safe_paths import UnsafePathError, inside

if TYPE_CHECKING:
    from components.metrics import ScoreCounts

MANIFEST = "MANIFEST.json"
MODEL_META = "model.json"
TABLES = "tables"
EXPORT = "export"
EMBEDDING_FILE = "embedding.npz"
DENSE_FILE = "dense.npz"
SCORES = "scores"
VALID, TEST = "valid", "test"  # the splits a checkpoint is scored on
TEST_CALIBRATED = "test-calibrated"  # the test split's scores through the calibration the checkpoint carries
TEST_ROWS = "test-rows"  # under scores/: the workers' per-row test predictions


# What the evaluation needs of a checkpoint: its scores and what describes it.
EVALUATION_PARTS = (MODEL_META, SCORES + "/")
# What rebuilds its model in one process (small tables, tests): the export and what rebuilds the network.
SCORING_PARTS = (MODEL_META, EXPORT + "/")


class CheckpointError(RuntimeError):
    pass


@dataclass
class Checkpoint:
    """A committed checkpoint, loaded for evaluation or serving."""

    meta: dict[str, Any]
    ids: np.ndarray
    rows: np.ndarray  # as exported: float32, or float16 (checkpoint.export_dtype)
    dense: dict[str, np.ndarray]


def file_digest(path: str | os.PathLike) -> tuple[int, str]:
    """``(bytes, sha256 hex)`` of a file, read once in blocks: what a manifest records for it."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def write_json_atomic(path: Path, payload: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True))
    os.replace(tmp, path)


def checkpoint_file(root: str | os.PathLike, rel: str) -> Path:
    """Where the file ``rel`` that a manifest names is under ``root``: inside it, symlinks included
    (:func:`components.safe_paths.inside`), else a :class:`CheckpointError`, what checkpoint readers handle."""
    try:
        return inside(root, rel, f"the checkpoint {root}")
    except UnsafePathError as err:
        raise CheckpointError(str(err)) from None


def verify(root: str | os.PathLike, parts: Optional[tuple[str, ...]] = None) -> dict[str, Any]:
    """The manifest, after checking its files (those starting with one of ``parts``, or all).

    Raises :class:`CheckpointError` naming the file that is missing, truncated or altered.
    """
    root = Path(root)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{root} is not a committed checkpoint: {MANIFEST} is missing "
                              "(the save did not finish); it is never loaded")
    manifest = json.loads(manifest_path.read_text())
    for name, expected in manifest["files"].items():
        if parts is not None and not name.startswith(parts):
            continue
        path = checkpoint_file(root, name)
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} listed in {MANIFEST} is missing")
        if file_digest(path) != (expected["size"], expected["sha256"]):
            raise CheckpointError(f"checkpoint file {path} does not match its checksum in {MANIFEST} "
                                  "(truncated or altered)")
    return manifest


def save_export(root: str | os.PathLike, ids: np.ndarray, rows: np.ndarray, dense: dict[str, np.ndarray],
                rows_dtype: ExportDtype = ExportDtype.float32) -> np.ndarray:
    """Write the export: the embedding rows as ``rows_dtype``, the dense parameters as they are (float32).

    Only scoring and serving read the rows; resume reads the servers' table files and ``dense.npz``, which
    is why the rows may be narrowed and the dense parameters may not. Raises :class:`CheckpointError` when a
    finite row value does not fit ``rows_dtype`` (float16 ends at 65504). Returns the rows as stored.
    """
    with np.errstate(over="ignore"):  # overflow is reported below, naming the values
        stored = rows.astype(rows_dtype.value)
    overflow = np.isfinite(rows) & ~np.isfinite(stored)
    if overflow.any():
        raise CheckpointError(f"embedding values up to {np.abs(rows[overflow]).max():.6g} do not fit "
                              f"checkpoint.export_dtype={rows_dtype.value} (largest finite value "
                              f"{np.finfo(stored.dtype).max:.6g}): export float32 or narrow table.weight_bounds")
    export = Path(root) / EXPORT
    export.mkdir(parents=True, exist_ok=True)
    np.savez(export / EMBEDDING_FILE, ids=ids.astype(np.uint64), rows=stored)
    np.savez(export / DENSE_FILE, **dense)
    return stored


def verify_meta(root: str | os.PathLike, parts: Optional[tuple[str, ...]] = None) -> dict[str, Any]:
    """The ``model.json`` of a committed checkpoint, after checking its files (those of ``parts``, or all)."""
    verify(root, parts)
    return json.loads((Path(root) / MODEL_META).read_text())


def load_scores(root: str | os.PathLike, split: str) -> "ScoreCounts":
    """The merged counts of the checkpoint's predictions on ``split`` (:data:`VALID`, :data:`TEST`)."""
    from components.metrics import ScoreCounts

    path = Path(root) / SCORES / f"{split}.npz"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {root} holds no scores of the {split} split ({SCORES}/{split}.npz): it "
                              "was made before checkpoints were scored through the servers, or its data has no "
                              f"{split} split")
    return ScoreCounts.load(path)


@dataclass
class RowPredictions:
    """A worker's predictions of every row of its share of the test split, in its shards' order: ``raw`` (float32)
    and, when the checkpoint carries a calibration, ``calibrated``; the rows' ``weights`` the counts were weighted
    by (weighted data); ``shard_rows`` are the rows of each of ``shards`` (paths relative to the dataset) as the
    worker's dataset counted them."""

    shards: list[str]
    shard_rows: list[int]
    raw: np.ndarray
    calibrated: Optional[np.ndarray] = None
    weights: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        if len(self.shards) != len(self.shard_rows):
            raise ValueError(f"{len(self.shards)} shards but {len(self.shard_rows)} row counts")
        for name, column in self.columns().items():
            if len(column) != sum(self.shard_rows):
                raise ValueError(f"{len(column)} {name} for the {sum(self.shard_rows)} rows of shards {self.shards}")

    def columns(self) -> dict[str, np.ndarray]:
        """The per-row arrays present, by name."""
        return {name: column for name, column in (("raw", self.raw), ("calibrated", self.calibrated),
                                                  ("weights", self.weights)) if column is not None}

    def save(self, path: str | os.PathLike) -> None:
        """Write as an ``.npz`` at ``path``, atomically (a reader never sees half a file)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:  # a file object: np.savez would add ".npz" to a name
            np.savez(f, shards=np.array(self.shards, dtype=str), shard_rows=np.array(self.shard_rows, np.int64),
                     **self.columns())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RowPredictions":
        with np.load(path) as saved:
            return cls([str(shard) for shard in saved["shards"]], saved["shard_rows"].tolist(),
                       *(saved[name] if name in saved.files else None for name in ("raw", "calibrated", "weights")))


def row_predictions_file(worker: int) -> str:
    """Worker ``worker``'s :class:`RowPredictions` in a checkpoint, relative to its root."""
    return f"{SCORES}/{TEST_ROWS}/worker-{worker:05d}.npz"


def load_row_predictions(root: str | os.PathLike, shards: list[str], shard_rows: list[int]) -> RowPredictions:
    """Every worker's per-row test predictions of the checkpoint, in the order of the test split being evaluated:
    its ``shards`` with ``shard_rows`` rows each (``stats.json``'s). Raises :class:`CheckpointError` naming the
    shard that no worker scored, or that the workers scored with another number of rows (other data)."""
    folder = Path(root) / SCORES / TEST_ROWS
    parts = [RowPredictions.load(path) for path in sorted(folder.glob("worker-*.npz"))]
    if not parts:
        raise CheckpointError(f"checkpoint {root} holds no per-row test predictions ({SCORES}/{TEST_ROWS}/): it was "
                              "trained without eval.group_by and eval.slices, which the per-group metrics need")
    scored: dict[str, dict[str, np.ndarray]] = {}  # shard -> its rows' slice of each column
    for part in parts:
        starts = np.cumsum([0, *part.shard_rows])
        for shard, start, end in zip(part.shards, starts[:-1], starts[1:]):
            scored[shard] = {name: column[start:end] for name, column in part.columns().items()}
    for shard, rows in zip(shards, shard_rows):
        if shard not in scored:
            raise CheckpointError(f"no worker saved per-row predictions of test shard {shard} in checkpoint {root}")
        if len(scored[shard]["raw"]) != rows:
            raise CheckpointError(f"test shard {shard} has {rows} rows but checkpoint {root} holds "
                                  f"{len(scored[shard]['raw'])} predictions of it: it was scored on other data")
    # Every worker scored through the same calibration, of the same data: the columns of any part holding rows.
    template = next((part for part in parts if part.shards), parts[0]).columns()
    return RowPredictions(list(shards), list(shard_rows), **{
        name: np.concatenate([column[:0], *(scored[shard][name] for shard in shards)])
        for name, column in template.items()})


def save_dense(root: str | os.PathLike, dense: dict[str, np.ndarray]) -> None:
    """Every dense parameter by name (float32): what resume restores and every scoring program reads."""
    export = Path(root) / EXPORT
    export.mkdir(parents=True, exist_ok=True)
    np.savez(export / DENSE_FILE, **dense)


def save_worker_rows(root: str | os.PathLike, ids: np.ndarray, rows: np.ndarray) -> None:
    """The rows the workers pulled, where the servers cannot save their table (geo, SSD)."""
    export = Path(root) / EXPORT
    export.mkdir(parents=True, exist_ok=True)
    np.savez(export / EMBEDDING_FILE, ids=ids.astype(np.uint64), rows=rows.astype(np.float32))


def load(root: str | os.PathLike) -> Checkpoint:
    """A verified checkpoint's export, the form evaluation and serving read (the tables need not be here)."""
    root = Path(root)
    verify(root, parts=SCORING_PARTS)
    meta = json.loads((root / MODEL_META).read_text())
    with np.load(root / EXPORT / EMBEDDING_FILE) as table:
        ids, rows = table["ids"], table["rows"]
    with np.load(root / EXPORT / DENSE_FILE) as dense:
        params = {name: dense[name] for name in dense.files}
    return Checkpoint(meta=meta, ids=ids, rows=rows, dense=params)
