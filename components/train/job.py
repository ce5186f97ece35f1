"""What every launcher backend shares: the job prepared once before it starts, its events, its result.

:func:`prepare_job` resolves what every role must agree on (the checkpoint to restore, ``table.shard_num``)
and plans the table's memory, before any process starts; a backend (:mod:`components.train.backends`) then
starts the roles with :meth:`PreparedJob.spec`. The roles print events (:mod:`components.ps.contract`),
which :class:`EventLog` turns into progress lines and the :class:`JobResult`, whether they arrive through a
local pipe or a pod's log stream.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from components.checkpoint.restore import RestoreTarget, restore_target
from components.checkpoint.store import CheckpointStore
from components.config import CtrConfig, to_dict
from components.ps.contract import CHECKPOINT, EPOCH, PROGRESS, JobSpec, parse_event
from components.train import planner


class PsJobError(RuntimeError):
    """A PS job failed; ``role`` names the process (or pod) that failed first."""

    def __init__(self, role: str, message: str):
        self.role = role
        super().__init__(message)


@dataclass
class JobResult:
    epochs: list[dict]
    seconds: float
    checkpoints: list[dict]  # committed during this job, oldest first: {id, epoch, uri}
    restored_from: Optional[RestoreTarget]
    plan: Optional[planner.MemoryPlan] = None  # the sparse table's memory plan (None in geo mode)
    # Local backend: each server's RSS in bytes when it started serving and at its peak while the job ran.
    server_memory: Optional[list[dict]] = None


@dataclass(frozen=True)
class PreparedJob:
    """A PS job's config with everything its roles must agree on resolved, derived once before it starts.

    ``cfg``: ``table.shard_num`` resolved (:func:`planned_config`); ``store``: the checkpoint store, cleaned of
    saves that never committed; ``restore``: what the job starts from; ``plan``: the sparse table's memory plan
    (None in geo mode), checked to fit.
    """

    cfg: CtrConfig
    store: CheckpointStore
    restore: Optional[RestoreTarget]
    plan: Optional[planner.MemoryPlan]

    def spec(self, data_dir: str, workdir: str, staging_dir: str) -> JobSpec:
        """The spec every role of this job gets (see :class:`components.ps.contract.JobSpec`)."""
        return JobSpec(config=to_dict(self.cfg), data_dir=data_dir, workdir=workdir, staging_dir=staging_dir,
                       restore=self.restore)

    def lines(self) -> list[str]:
        """What the job starts from and its memory plan, as lines to print before it starts."""
        return ([self.restore.describe()] if self.restore else []) + plan_lines(self.plan)


def planned_config(cfg: CtrConfig, restore: Optional[RestoreTarget]) -> tuple[CtrConfig, str]:
    """``(cfg with table.shard_num resolved, where that count comes from)``: a restored table keeps its own."""
    saved_in = f"checkpoint {restore.id}" if restore else "the checkpoint"
    shard_num, source = planner.resolve_shard_num(cfg.table.shard_num, cfg.ps.servers,
                                                  restore.shard_num if restore else None, saved_in)
    return dataclasses.replace(cfg, table=dataclasses.replace(cfg.table, shard_num=shard_num)), source


def prepare_job(cfg: CtrConfig, stats: Optional[dict]) -> PreparedJob:
    """Resolve what a job starts from and plan its table; raises ConfigError (a table that cannot fit, a
    shard count a restored table refuses) or CheckpointError (a restore target that does not exist) before
    any process starts. ``stats``: the dataset's ``stats.json`` (its distinct ids bound the rows), if readable.
    """
    store = CheckpointStore(cfg.checkpoint.uri)
    store.cleanup_incomplete()  # a save that never committed is invisible; drop its files
    restore = restore_target(store, cfg.checkpoint.resume, cfg.checkpoint.warm_start)
    planned, shard_source = planned_config(cfg, restore)
    plan = planner.plan_memory(planned, planner.distinct_train_ids(stats), shard_source)
    if plan is not None:
        planner.check_fits(planned, plan)
    return PreparedJob(planned, store, restore, plan)


def plan_lines(plan: Optional[planner.MemoryPlan]) -> list[str]:
    return plan.lines() if plan else ["memory plan: none in geo mode (servers keep a MemorySparseGeoTable, "
                                      "each worker a dense vocab_size x embedding_dim copy)"]


def format_progress(event: dict) -> str:
    if event.get("state"):
        return f"[{event['role']} {event['index']}] {event['state']}"
    loss = event.get("loss")
    return (f"[worker {event['index']}] epoch {event['epoch']} | {event['examples']:,} examples | "
            f"{event['examples_per_s']:,.0f} ex/s | loss {loss:.4f} | auc {event['auc']:.4f}"
            if loss is not None else f"[worker {event['index']}] epoch {event['epoch']} | {event['examples']:,} examples")


def format_epoch(event: dict) -> str:
    return (f"== epoch {event['epoch']} done: {event['examples']:,} examples in {event['seconds']:.1f}s, "
            f"global train AUC {event['auc']:.4f}")


class EventLog:
    """Collects the events of a job's processes and echoes them as readable lines (thread-safe)."""

    def __init__(self, echo: Callable[[str], None]):
        self.echo = echo
        self.progress: dict[str, dict] = {}
        self.epochs: list[dict] = []
        self.checkpoints: list[dict] = []
        self._lock = threading.Lock()

    def feed(self, source: str, line: str) -> bool:
        """Take one output line of process ``source``; True when it was an event."""
        parsed = parse_event(line)
        if parsed is None:
            return False
        tag, event = parsed
        with self._lock:
            if tag == PROGRESS:
                self.progress[source] = event
                self.echo(format_progress(event))
            elif tag == EPOCH:
                # A restarted job retrains from its last checkpoint: a pass reported again replaces the old report.
                self.epochs = [e for e in self.epochs if e["epoch"] < event["epoch"]] + [event]
                self.echo(format_epoch(event))
            elif tag == CHECKPOINT:
                self.checkpoints.append(event)
                evicted = (f" ({event['evicted']:,} rows evicted since the last checkpoint)"
                           if event.get("evicted") is not None else "")
                validation = event.get("validation")
                judged = (f"; validation auc {validation['auc']:.4f}, logloss {validation['logloss']:.4f}"
                          f"{' (best so far)' if event.get('best') else ''}{', stopping' if event.get('stop') else ''}"
                          if validation else "")
                self.echo(f"== checkpoint {event['id']} committed to {event['uri']}{evicted}{judged}")
        return True
