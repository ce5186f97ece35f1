"""Periodic checkpoints and resume for a running PS job, on any fsspec store.

A checkpoint (id from :func:`make_id`: time, pass, examples trained so far) is taken after a pass by every
worker together:

1. barrier; worker 0 asks the servers to write their table shards into a staging path on their own disks
   (``fleet.save_persistables``), and every worker pulls the dense parameters from the servers; each
   server's uploader puts its shards into the store;
2. when the servers cannot save the table (:func:`rows_from_workers`), step 1 saves nothing and each
   worker instead uploads rows for the ids of its shards to ``_worker_rows/`` in the store; worker 0
   merges them into the export and removes them;
3. worker 0 writes the export (sparse rows parsed from the shards or merged from the workers, dense
   parameters) and the training state, uploads everything, and commits: ``MANIFEST.json`` last, then
   ``LATEST``; then prunes.

Resume (``checkpoint.resume``): each server downloads the table files and loads them with
``fleet.init_server(dir)``; worker 0 sets the exported dense parameters in its scope before
``fleet.init_worker()``, which pushes them to the servers (so a different server count works); training
continues with the pass after the checkpoint's. The dense optimizer's moments are not restored.

Nothing assumes a shared disk: each server's sidecar (:mod:`components.train.shard_uploader`) uploads the
shards that server wrote, worker 0 reads them back from the store for the export, and workers' rows travel
through the store too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np

from components import checkpoint
from components.checkpoint_store import CheckpointStore, make_id
from components.config import CtrConfig, Mode, TableClass

STATE_FILE = "state.json"
WORKER_ROWS = "worker_rows"  # in a checkpoint: each worker's part of the export's rows
WORKER_ROWS_SCRATCH = "_worker_rows"  # in the store: the parts until worker 0 merged them


def checkpoint_id(epoch: int, examples: int) -> str:
    return make_id(epoch, examples)


def should_save(epoch: int, epochs: int, every_passes: int) -> bool:
    return epoch == epochs or epoch % every_passes == 0


def server_restore_dir(store: CheckpointStore, ckpt_id: str, local_root: Path) -> Path:
    """Download a checkpoint's server tables for ``fleet.init_server``; returns the directory to load."""
    local = local_root / f"restore-{ckpt_id}"
    if local.exists():
        shutil.rmtree(local)
    store.download(ckpt_id, local, select=lambda rel: rel.startswith(checkpoint.TABLES + "/"))
    return local / checkpoint.TABLES


def restore_source(store: CheckpointStore, resume: str, warm_start: Optional[str]) -> Optional[dict]:
    """What a job starts from: its own checkpoint to continue (``resume``), else another run's weights
    (``warm_start``, training from pass 1), else nothing. Raises CheckpointError for a missing target."""
    ckpt_id = store.resolve(resume)
    if ckpt_id:
        return {"uri": store.uri, "id": ckpt_id, "continue": True, "shard_num": saved_shard_num(store, ckpt_id)}
    if not warm_start:
        return None
    uri, _, wanted = warm_start.partition("#")
    source = CheckpointStore(uri)
    ckpt_id = source.resolve(wanted or "latest")
    if ckpt_id is None:
        raise checkpoint.CheckpointError(f"checkpoint.warm_start: {source.display_uri} holds no committed checkpoint")
    return {"uri": uri, "id": ckpt_id, "continue": False, "shard_num": saved_shard_num(source, ckpt_id)}


def saved_shard_num(store: CheckpointStore, ckpt_id: str) -> Optional[int]:
    """The shard count a checkpoint's table was saved in (its model.json): the servers can load it into no other."""
    meta = store.read_json(ckpt_id, checkpoint.MODEL_META) or {}
    return meta.get("table", {}).get("shard_num")


def restart_restore(store: CheckpointStore, restore: Optional[dict], attempt: int) -> Optional[dict]:
    """After a whole-job restart (``attempt`` > 0): continue from the job's latest committed checkpoint, if
    it has one; before any commit the restarted job starts where the first attempt did."""
    if attempt > 0:
        latest = store.latest()
        if latest:
            return {"uri": store.uri, "id": latest, "continue": True}
    return restore


def resume_state(store: CheckpointStore, ckpt_id: Optional[str]) -> dict[str, Any]:
    """The training state a resumed job starts from (epoch 0 and no history when not resuming)."""
    if ckpt_id is None:
        return {"epoch": 0, "history": []}
    state = store.read_json(ckpt_id, STATE_FILE)
    if state is None:
        raise checkpoint.CheckpointError(f"checkpoint {ckpt_id} in {store.uri} has no {STATE_FILE}")
    return state


def restore_dense(store: CheckpointStore, ckpt_id: str, local_root: Path) -> dict[str, np.ndarray]:
    local = local_root / f"restore-{ckpt_id}-dense"
    if local.exists():
        shutil.rmtree(local)
    store.download(ckpt_id, local, select=lambda rel: rel == f"{checkpoint.EXPORT}/{checkpoint.DENSE_FILE}")
    with np.load(local / checkpoint.EXPORT / checkpoint.DENSE_FILE) as dense:
        return {name: dense[name] for name in dense.files}


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
    target = store.fs_path(None, _worker_part(epoch, worker))
    store.ensure_parent(target)
    store.fs.put_file(str(local), target)


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
        store.fs.get_file(store.fs_path(None, _worker_part(epoch, i)), str(path))
        with np.load(path) as part:
            parts.append((part["ids"], part["rows"]))
    store.fs.rm(store.fs_path(None, f"{WORKER_ROWS_SCRATCH}/e{epoch:04d}"), recursive=True)
    ids = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts]).astype(np.float64)
    unique, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    summed = np.zeros((len(unique), rows.shape[1]))
    np.add.at(summed, inverse, rows)
    return unique, (summed / counts[:, None]).astype(np.float32)


def fetch_uploaded_table(store: CheckpointStore, ckpt_id: str, table_dir_rel: str, local: Path) -> Path:
    """The servers' uploaded shards of one table, fetched for the export (the checkpoint is not committed yet)."""
    if local.exists():
        shutil.rmtree(local)
    local.mkdir(parents=True)
    for rel in store.list_files(ckpt_id, table_dir_rel):
        store.fs.get_file(store.fs_path(ckpt_id, rel), str(local / Path(rel).name))
    return local


def commit_checkpoint(store: CheckpointStore, ckpt_id: str, local_dir: Path, server_files: dict, meta: dict,
                      state: dict, keep_last: int) -> dict:
    """Upload worker 0's part (export, state, workers' rows) beside the servers' shards, then make the checkpoint
    visible and prune old ones."""
    (local_dir / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))
    files = {**server_files, **store.upload_dir(local_dir, ckpt_id)}
    manifest = store.commit(ckpt_id, files, meta)
    store.prune(keep_last)
    shutil.rmtree(local_dir, ignore_errors=True)
    return manifest
