"""What a PS job starts from, and how its processes restore it.

A job resumes its own store's checkpoint (``checkpoint.resume``: training continues after it), or starts from
another run's weights (``checkpoint.warm_start``: training starts at pass 1), or from scratch; a job training one
day of day partitions continues the model the day before delivered (:func:`day_restore_target`). The launcher
resolves that once, into a :class:`RestoreTarget` that travels in the job spec; the processes then restore it:
each server downloads the table files and loads them with ``fleet.init_server(dir)``
(:func:`server_restore_dir`); worker 0 sets the exported dense parameters in its scope before
``fleet.init_worker()``, which pushes them to the servers (so a different server count works:
:func:`restore_dense`); every worker continues with the training state (:func:`resume_state`). A job continuing its
own store's checkpoint also continues the dense optimizer: each server loads its part of the dense tables, Adam's
moments with the parameters (:func:`components.ps.strategy.load_dense_tables`).

Before any work the target is checked whole (:mod:`components.checkpoint.verify`, which says what that costs): a
corrupt or half-written newest checkpoint gives way to the newest intact one before it, with one warning line; a
checkpoint the user named is an error instead, as falling back would train from something they did not ask for.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

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


def warning(message: str) -> None:
    """A restore warning as the run's console shows a step's warnings: one ``warning:`` line."""
    print(f"warning: {message}", flush=True)


def newest_key(key: Optional[str]) -> bool:
    """Whether a resume (or warm-start) key asks for the newest checkpoint rather than naming one."""
    return (key or "auto").strip().lower() in ("latest", "auto")


def restore_target(store: "CheckpointStore", resume: str, warm_start: Optional[str], day: Optional[str] = None, *,
                   verify: bool = True, warn: Callable[[str], None] = warning) -> Optional[RestoreTarget]:
    """What a job on ``store`` starts from: its own checkpoint to continue (``resume``; a ``day``'s job:
    :func:`day_restore_target`), else another run's weights (``warm_start``), else nothing. Raises CheckpointError
    for a target that names no committed checkpoint.

    ``verify``: the target is checked whole first (:mod:`components.checkpoint.verify`). The newest checkpoint
    (``latest``, ``auto``, a day's) that is not gives way to the newest intact one before it, with one ``warn``
    line naming what is wrong; a CheckpointError when none is intact, or when the user named the checkpoint."""
    from components.checkpoint.store import CheckpointStore

    if day is not None:
        ckpt_id = day_restore_target(store, day, verify=verify, warn=warn)
    else:
        ckpt_id = store.resolve(resume)
        if ckpt_id and verify:
            ckpt_id = _intact(store, ckpt_id, newest_key(resume), "checkpoint.resume", "resuming from", warn)
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
    if verify:
        ckpt_id = _intact(source, ckpt_id, newest_key(wanted), "checkpoint.warm_start", "warm start from", warn)
    return RestoreTarget(uri, ckpt_id, resume=False, shard_num=saved_shard_num(source, ckpt_id))


def _intact(store: "CheckpointStore", ckpt_id: str, newest: bool, key: str, how: str,
            warn: Callable[[str], None]) -> str:
    """``ckpt_id`` when it is intact; for the ``newest``, else the newest intact committed checkpoint before it
    (one ``warn`` line); else a CheckpointError starting with ``key``."""
    from components.checkpoint.verify import checkpoint_problem, describe_skipped, newest_intact

    if not newest:
        problem = checkpoint_problem(store, ckpt_id)
        if problem is not None:
            raise CheckpointError(f"{key}: checkpoint {ckpt_id} in {store.display_uri} is corrupt ({problem}): name "
                                  "an intact one, or 'latest' for the newest intact one")
        return ckpt_id
    older = [i for i in reversed(store.committed()) if i <= ckpt_id]
    chosen, skipped = newest_intact(store, older)
    if chosen is None:
        raise CheckpointError(f"{key}: {describe_skipped(store, skipped)}: no committed checkpoint there is "
                              "intact; point it at another store, or start fresh (checkpoint.resume=none)")
    if skipped:
        warn(f"{describe_skipped(store, skipped)}; {how} {chosen} instead, the newest intact checkpoint before it")
    return chosen


def day_restore_target(store: "CheckpointStore", day: str, *, verify: bool = True,
                       warn: Callable[[str], None] = warning) -> Optional[str]:
    """The checkpoint a job training ``day`` continues: the day's own latest (a job killed mid-day resumes it), else
    the checkpoint the last trained day delivered (:mod:`components.checkpoint.days`), else none (the first day).

    ``verify``: a corrupt checkpoint of the day gives way to the day's newest intact one, else to the one the last
    day delivered (one ``warn`` line); that one corrupt is a CheckpointError (an older one would skip a day)."""
    from components.checkpoint.days import DayLedger
    from components.checkpoint.verify import checkpoint_problem, describe_skipped, newest_intact

    latest = store.latest()
    if latest is not None and _day_of(store, latest) == str(day):
        if not verify:
            return latest
        same_day = [i for i in reversed(store.committed()) if i <= latest and _day_of(store, i) == str(day)]
        chosen, skipped = newest_intact(store, same_day)
        if chosen is not None:
            if skipped:
                warn(f"{describe_skipped(store, skipped)}; resuming day {day!r} from {chosen} instead, the newest "
                     "intact checkpoint of that day")
            return chosen
        warn(f"{describe_skipped(store, skipped)}; day {day!r} starts again from the checkpoint the day before "
             "delivered")
    last = DayLedger(store).last()
    if last is None:
        return None
    if last["checkpoint"] not in store.committed():
        raise CheckpointError(f"{store.display_uri}: checkpoint {last['checkpoint']}, which day {last['day']!r} "
                              "delivered, is not committed there any more: the next day has nothing to continue")
    problem = checkpoint_problem(store, last["checkpoint"]) if verify else None
    if problem is not None:
        raise CheckpointError(f"{describe_skipped(store, [(last['checkpoint'], problem)])}: it is what day "
                              f"{last['day']!r} delivered, which day {day!r} continues; an older checkpoint would "
                              "skip a day of training")
    return last["checkpoint"]


def _day_of(store: "CheckpointStore", ckpt_id: str) -> Optional[str]:
    """The day a checkpoint was trained on (its state.json), None when it says none or is not JSON (altered)."""
    from components.checkpoint.store import CheckpointStoreError

    try:
        return (store.read_json(ckpt_id, STATE_FILE) or {}).get("day")
    except CheckpointStoreError:  # the store cannot be read: that says nothing about this checkpoint
        raise
    except CheckpointError:
        return None


def saved_shard_num(store: "CheckpointStore", ckpt_id: str) -> Optional[int]:
    """The shard count a checkpoint's table was saved in (its model.json)."""
    meta = store.read_json(ckpt_id, MODEL_META) or {}
    return meta.get("table", {}).get("shard_num")


def restart_target(store: "CheckpointStore", restore: Optional[RestoreTarget], attempt: int,
                   shard_num: Optional[int], run_id: str, *, verify: bool = False,
                   warn: Callable[[str], None] = warning) -> Optional[RestoreTarget]:
    """After a whole-job restart (``attempt`` > 0): continue from the newest checkpoint this run committed (its
    ``state.json`` names ``run_id``; saved in the job's ``shard_num``). Before this run committed one, the
    restarted job starts where the first attempt did: a checkpoint another run left in the store is never taken.

    ``verify``: the newest of this run's checkpoints that is intact (:mod:`components.checkpoint.verify`; one
    ``warn`` line names those skipped): a role killed while it committed must not make every attempt after it
    restore the same broken checkpoint."""
    from components.checkpoint.verify import describe_skipped, newest_intact

    if attempt == 0:
        return restore
    if not verify:
        for ckpt_id in reversed(store.committed()):
            if (store.read_json(ckpt_id, STATE_FILE) or {}).get("run_id") == run_id:
                return RestoreTarget(store.uri, ckpt_id, resume=True, shard_num=shard_num)
        return restore
    # A checkpoint whose state.json cannot be read is a candidate too: newest_intact names what is wrong with it.
    own = [i for i in reversed(store.committed()) if _run_of(store, i) in (run_id, None)]
    chosen, skipped = newest_intact(store, own)
    if skipped:
        warn(f"{describe_skipped(store, skipped)}; the restart resumes from "
             f"{chosen or 'where the first attempt started'} instead")
    return RestoreTarget(store.uri, chosen, resume=True, shard_num=shard_num) if chosen else restore


def _run_of(store: "CheckpointStore", ckpt_id: str) -> Optional[str]:
    """The run that committed a checkpoint (its state.json), None when that cannot be read (altered)."""
    from components.checkpoint.store import CheckpointStoreError

    try:
        return (store.read_json(ckpt_id, STATE_FILE) or {}).get("run_id")
    except CheckpointStoreError:
        raise
    except CheckpointError:
        return None


def resume_state(store: Optional["CheckpointStore"], restore: Optional[RestoreTarget],
                 day: Optional[str] = None) -> dict[str, Any]:
    """The training state a job starts from: the resumed checkpoint's (for a ``day``'s job, only a checkpoint of that
    day: one of an earlier day starts the day at pass 1, early stopping anew), else epoch 0 and no history.
    ``new_day``: the job starts ``day`` from a model that has not seen it."""
    fresh = {"epoch": 0, "history": [], "new_day": day is not None}
    if restore is None or not restore.resume:
        return fresh
    state = store.read_json(restore.id, STATE_FILE)
    if state is None:
        raise CheckpointError(f"checkpoint {restore.id} in {store.uri} has no {STATE_FILE}")
    if day is not None and state.get("day") != str(day):
        return fresh
    return {**state, "new_day": False}


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
