"""What a PS job starts from, and how its processes restore it.

A job resumes its own store's checkpoint (``checkpoint.resume``: training continues after it), or starts from
another run's weights (``checkpoint.warm_start``: training starts at pass 1), or from scratch. The launcher
resolves that once, into a :class:`RestoreTarget` that travels in the job spec; the processes then restore it:
each server downloads the table files and loads them with ``fleet.init_server(dir)``
(:func:`server_restore_dir`); worker 0 sets the exported dense parameters in its scope before
``fleet.init_worker()``, which pushes them to the servers (so a different server count works:
:func:`restore_dense`); every worker continues with the training state (:func:`resume_state`). The dense
optimizer's moments are not restored.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from components.checkpoint.format import DENSE_FILE, EXPORT, MODEL_META, TABLES, CheckpointError

if TYPE_CHECKING:  # the store pulls in fsspec and botocore; a readiness probe imports this module's dataclass
    from components.checkpoint.store import CheckpointStore

# In a checkpoint: the pass (and chunk) it was taken after, the passes' history, the run that made it.
STATE_FILE = "state.json"


@dataclass(frozen=True)
class RestoreTarget:
    """A committed checkpoint a job starts from.

    ``resume``: continue training after it (the job's own store); else a warm start from its weights (pass 1).
    ``shard_num``: the shard count its table was saved in (None: unknown); the servers load it into no other.
    """

    uri: str
    id: str
    resume: bool
    shard_num: Optional[int] = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "RestoreTarget":
        return cls(uri=raw["uri"], id=raw["id"], resume=bool(raw["resume"]), shard_num=raw.get("shard_num"))

    def describe(self) -> str:
        from components.checkpoint.store import CheckpointStore

        how = "resuming from" if self.resume else "warm start from"
        return f"{how} checkpoint {self.id} in {CheckpointStore(self.uri).display_uri}"


def restore_target(store: "CheckpointStore", resume: str, warm_start: Optional[str]) -> Optional[RestoreTarget]:
    """What a job on ``store`` starts from: its own checkpoint to continue (``resume``), else another run's weights
    (``warm_start``), else nothing. Raises CheckpointError for a target that names no committed checkpoint."""
    from components.checkpoint.store import CheckpointStore

    ckpt_id = store.resolve(resume)
    if ckpt_id:
        return RestoreTarget(store.uri, ckpt_id, resume=True, shard_num=saved_shard_num(store, ckpt_id))
    if not warm_start:
        return None
    uri, _, wanted = warm_start.partition("#")
    source = CheckpointStore(uri)
    try:
        ckpt_id = source.resolve(wanted or "auto")
    except CheckpointError as err:
        raise CheckpointError(f"checkpoint.warm_start: {err}") from None
    if ckpt_id is None:
        raise CheckpointError(f"checkpoint.warm_start: {source.display_uri} holds no committed checkpoint")
    return RestoreTarget(uri, ckpt_id, resume=False, shard_num=saved_shard_num(source, ckpt_id))


def saved_shard_num(store: "CheckpointStore", ckpt_id: str) -> Optional[int]:
    """The shard count a checkpoint's table was saved in (its model.json)."""
    meta = store.read_json(ckpt_id, MODEL_META) or {}
    return meta.get("table", {}).get("shard_num")


def restart_target(store: "CheckpointStore", restore: Optional[RestoreTarget], attempt: int,
                   shard_num: Optional[int], run_id: str) -> Optional[RestoreTarget]:
    """After a whole-job restart (``attempt`` > 0): continue from the newest checkpoint this run committed (its
    ``state.json`` names ``run_id``; saved in the job's ``shard_num``). Before this run committed one, the
    restarted job starts where the first attempt did: a checkpoint another run left in the store is never taken."""
    if attempt > 0:
        for ckpt_id in reversed(store.committed()):
            if (store.read_json(ckpt_id, STATE_FILE) or {}).get("run_id") == run_id:
                return RestoreTarget(store.uri, ckpt_id, resume=True, shard_num=shard_num)
    return restore


def resume_state(store: Optional["CheckpointStore"], restore: Optional[RestoreTarget]) -> dict[str, Any]:
    """The training state a job starts from: the resumed checkpoint's, else epoch 0 and no history."""
    if restore is None or not restore.resume:
        return {"epoch": 0, "history": []}
    state = store.read_json(restore.id, STATE_FILE)
    if state is None:
        raise CheckpointError(f"checkpoint {restore.id} in {store.uri} has no {STATE_FILE}")
    return state


def server_restore_dir(store: "CheckpointStore", ckpt_id: str, local_root: Path) -> Path:
    """Download a checkpoint's server tables for ``fleet.init_server``; returns the directory to load."""
    local = local_root / f"restore-{ckpt_id}"
    if local.exists():
        shutil.rmtree(local)
    store.download(ckpt_id, local, select=lambda rel: rel.startswith(TABLES + "/"))
    return local / TABLES


def restore_dense(store: "CheckpointStore", ckpt_id: str, local_root: Path) -> dict[str, np.ndarray]:
    """The exported dense parameters of a checkpoint, by name."""
    local = local_root / f"restore-{ckpt_id}-dense"
    if local.exists():
        shutil.rmtree(local)
    store.download(ckpt_id, local, select=lambda rel: rel == f"{EXPORT}/{DENSE_FILE}")
    with np.load(local / EXPORT / DENSE_FILE) as dense:
        return {name: dense[name] for name in dense.files}
