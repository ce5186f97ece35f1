"""How a running PS job takes a checkpoint, on any fsspec store (restoring one: :mod:`components.checkpoint.restore`).

A checkpoint (id from :func:`make_id`: time, pass, examples trained so far) is taken after a pass by every
worker together:

1. barrier; worker 0 asks the servers to write their table shards into a staging path on their own disks
   (``fleet.save_persistables``), and every worker pulls the dense parameters from the servers; each
   server's uploader puts its shards into the store;
2. when the servers cannot save the table (:func:`rows_from_workers`), step 1 saves nothing and each
   worker instead uploads rows for the ids of its shards to ``_worker_rows/`` in the store; worker 0
   merges them into the export and removes them;
3. every worker scores its share of the validation and test splits through the servers (a program that only
   pulls: :mod:`components.ps.pull_scoring`) and uploads its :class:`~components.metrics.ScoreCounts` to
   ``_scores/`` in the store; worker 0 merges them into the checkpoint's ``scores/<split>.npz`` and removes them
   (with eval.group_by or eval.slices, each worker's per-row test predictions travel the same way, unmerged:
   worker 0 moves them into ``scores/test-rows/`` without reading them);
4. worker 0 writes the dense parameters (and, when the rows came from the workers, the export of their rows)
   and the training state, uploads them, and commits: ``MANIFEST.json`` last, then ``LATEST`` (and ``BEST``
   when the validation split says it is the best so far: :mod:`components.ps.validation`); then prunes.

No process but a server holds the table: the servers write their own shards, in parallel, and worker 0 only
collects their sizes and checksums. Nothing assumes a shared disk: each server's sidecar
(:mod:`components.ps.shard_uploader`) uploads the shards that server wrote, and workers' rows and scores travel
through the store too.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Optional

import numpy as np

from components.checkpoint.format import SCORES, TEST_ROWS, RowPredictions, row_predictions_file
from components.checkpoint.restore import STATE_FILE
from components.checkpoint.store import CheckpointStore
from components.config import CtrConfig, Mode, TableClass
from components.metrics import ScoreCounts

# Tries per store call in a running job: backoff 0.5 + 1 + 2 + 4 + 8 s rides out an endpoint that is away for
# about 15 s (a restart), then the call fails and names the store's error.
JOB_STORE_RETRIES = 6
WORKER_ROWS = "worker_rows"  # in a checkpoint: each worker's part of the export's rows
WORKER_ROWS_SCRATCH = "_worker_rows"  # in the store: the parts until worker 0 merged them
SCORES_SCRATCH = "_scores"  # in the store: each worker's score counts until worker 0 merged them


def should_save(epoch: int, epochs: int, every_passes: int) -> bool:
    return epoch == epochs or epoch % every_passes == 0


def rows_from_workers(cfg: CtrConfig) -> bool:
    """True when the export's rows come from the workers because the servers cannot save the table.

    Geo servers keep no saveable table. Paddle 2.6.2's SSDSparseTable::Save locks the table mutex and then
    calls SaveWithString, which locks it again, so every save of an SSD table hangs (seen in the CPU
    wheel's machine code): the workers pull its rows from the servers instead.
    """
    return cfg.ps.mode is Mode.geo or cfg.table.table_class is TableClass.SSDSparseTable


def _worker_part(epoch: int, worker: int) -> str:
    return f"{WORKER_ROWS_SCRATCH}/e{epoch:04d}/worker-{worker}.npz"


def upload_worker_rows(store: CheckpointStore, epoch: int, worker: int, ids: np.ndarray, rows: np.ndarray,
                       local_root: Path) -> None:
    local = local_root / f"rows-worker-{worker}.npz"
    np.savez(local, ids=ids.astype(np.uint64), rows=rows)
    store.put_file(local, _worker_part(epoch, worker))


def merged_worker_rows(store: CheckpointStore, epoch: int, workers: int, staging: Path):
    """One row per id from the workers' parts; an id trained by several workers is averaged.

    Geo copies of a row converge through the delta exchange but differ; rows pulled from the servers at
    one barrier are equal, so their mean is the row. The parts are kept in the checkpoint
    (``worker_rows/``) and removed from the scratch area.
    """
    parts = []
    for i in range(workers):
        path = staging / WORKER_ROWS / f"worker-{i}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(_worker_part(epoch, i), path)
        with np.load(path) as part:
            parts.append((part["ids"], part["rows"]))
    store.remove_tree(f"{WORKER_ROWS_SCRATCH}/e{epoch:04d}")
    ids = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts]).astype(np.float64)
    unique, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    summed = np.zeros((len(unique), rows.shape[1]))
    np.add.at(summed, inverse, rows)
    return unique, (summed / counts[:, None]).astype(np.float32)


def _scores_part(round_key: str, split: str, worker: int) -> str:
    return f"{SCORES_SCRATCH}/{round_key}/{split}-worker-{worker}.npz"


def upload_scores(store: CheckpointStore, round_key: str, split: str, worker: int, counts: ScoreCounts,
                  local_root: Path) -> None:
    """One worker's score counts of ``split`` in checkpoint round ``round_key``, into the store's scratch area."""
    local = local_root / f"scores-{split}-worker-{worker}.npz"
    counts.save(local)
    store.put_file(local, _scores_part(round_key, split, worker))
    local.unlink()


def merged_scores(store: CheckpointStore, round_key: str, splits: tuple[str, ...], workers: int,
                  staging: Path) -> dict[str, ScoreCounts]:
    """Every worker's counts of each split merged (exactly: :meth:`ScoreCounts.merge`), written into the
    checkpoint's ``scores/<split>.npz`` under ``staging``; the parts are removed from the scratch area (a job that
    died meanwhile leaves them to the next job's :func:`clear_scores`)."""
    merged = {}
    (staging / SCORES).mkdir(parents=True, exist_ok=True)
    for split in splits:
        parts = []
        for worker in range(workers):
            local = staging / SCORES / f".{split}-worker-{worker}.npz"
            part = _scores_part(round_key, split, worker)
            store.get_file(part, local)
            store.remove(part)
            parts.append(ScoreCounts.load(local))
            local.unlink()
        merged[split] = ScoreCounts.merge(parts)
        merged[split].save(staging / SCORES / f"{split}.npz")
    return merged


def _row_predictions_part(round_key: str, worker: int) -> str:
    return f"{SCORES_SCRATCH}/{round_key}/{TEST_ROWS}-worker-{worker}.npz"


def upload_row_predictions(store: CheckpointStore, round_key: str, worker: int, predictions: RowPredictions,
                           local_root: Path) -> None:
    """One worker's per-row test predictions of checkpoint round ``round_key``, into the store's scratch area."""
    local = local_root / f"{TEST_ROWS}-worker-{worker}.npz"
    predictions.save(local)
    store.put_file(local, _row_predictions_part(round_key, worker))
    local.unlink()


def collected_row_predictions(store: CheckpointStore, round_key: str, workers: int, staging: Path) -> None:
    """Every worker's per-row test predictions, moved as they are into the checkpoint under ``staging`` (each
    whole or absent: fetched under a temporary name) and removed from the scratch area."""
    for worker in range(workers):
        final = staging / row_predictions_file(worker)
        final.parent.mkdir(parents=True, exist_ok=True)
        local = final.with_name(f".{final.name}.tmp")
        part = _row_predictions_part(round_key, worker)
        store.get_file(part, local)
        os.replace(local, final)
        store.remove(part)


def clear_scores(store: CheckpointStore, round_key: Optional[str] = None) -> None:
    """Remove a merged round's scratch folder, or (no ``round_key``) the score parts a killed job left in the scratch
    area (only for a job holding the store's lease)."""
    store.remove_tree(f"{SCORES_SCRATCH}/{round_key}" if round_key else SCORES_SCRATCH)


def commit_checkpoint(store: CheckpointStore, ckpt_id: str, local_dir: Path, server_files: dict, meta: dict,
                      state: dict, keep_last: int, best: bool = False) -> dict:
    """Upload worker 0's part (export, state, workers' rows) beside the servers' shards, then make the checkpoint
    visible (``best``: and the store's best), and prune old ones."""
    (local_dir / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))
    files = {**server_files, **store.upload_dir(local_dir, ckpt_id)}
    manifest = store.commit(ckpt_id, files, meta)
    if best:
        store.mark_best(ckpt_id)
    store.prune(keep_last)
    shutil.rmtree(local_dir, ignore_errors=True)
    return manifest
