"""What every launcher backend shares: the job spec a role process reads, the events it prints, the result.

A role process (:mod:`components.train.role`) gets its spec as a file (local backend) or in the
``PS_JOB_SPEC`` environment variable (pods); it prints ``@progress`` / ``@epoch`` / ``@checkpoint`` /
``@done`` lines, which :class:`EventLog` turns into progress lines and the :class:`JobResult`, whether
they arrive through a local pipe or a pod's log stream.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from components.config import CtrConfig, to_dict
from components.train import planner

PROGRESS, EPOCH, CHECKPOINT, DONE = "@progress", "@epoch", "@checkpoint", "@done"
SPEC_ENV = "PS_JOB_SPEC"
RESTART_ENV = "PS_RESTART_ATTEMPT"  # pods: how many times the whole job was restarted before this attempt


class PsJobError(RuntimeError):
    """A PS job failed; ``role`` names the process (or pod) that failed first."""

    def __init__(self, role: str, message: str):
        self.role = role
        super().__init__(message)


@dataclass
class JobResult:
    epochs: list[dict]
    progress: dict[str, dict]
    seconds: float
    logs: dict[str, str]
    checkpoints: list[dict]  # committed during this job, oldest first: {id, epoch, uri}
    restored_from: Optional[dict]  # {uri, id, continue}: resumed (continue) or warm-started from
    plan: Optional[planner.MemoryPlan] = None  # the sparse table's memory plan (None in geo mode)
    # Local backend: each server's RSS in bytes when it started serving and at its peak while the job ran.
    server_memory: Optional[list[dict]] = None


def job_spec(cfg: CtrConfig, data_dir: str, workdir: str, staging_dir: str, restore: Optional[dict]) -> dict:
    """Everything a role process needs besides its environment.

    ``data_dir``: the prepared dataset, a local path or a remote fsspec URL (pods fetch their shards);
    ``workdir``: the process's scratch directory; ``staging_dir``: where servers save table shards before
    their uploader moves them to the store (the same path string on every machine).
    """
    return {"config": to_dict(planned_config(cfg, restore)), "data_dir": data_dir, "workdir": workdir,
            "staging_dir": staging_dir, "restore": restore}


def planned_config(cfg: CtrConfig, restore: Optional[dict]) -> CtrConfig:
    """``cfg`` with what every role of the job must agree on resolved: ``table.shard_num``."""
    shard_num, _ = planner.resolve_shard_num(cfg.table.shard_num, cfg.ps.servers, (restore or {}).get("shard_num"))
    return dataclasses.replace(cfg, table=dataclasses.replace(cfg.table, shard_num=shard_num))


def plan_job(cfg: CtrConfig, stats: Optional[dict], restore: Optional[dict]) -> Optional[planner.MemoryPlan]:
    """The sparse table's memory plan; raises ConfigError, before any process starts, when it cannot fit.

    ``stats``: the dataset's ``stats.json`` (its distinct ids bound the rows), when the launcher can read it.
    """
    saved_in = f"checkpoint {restore['id']}" if restore else "the checkpoint"
    plan = planner.plan_memory(cfg, planner.distinct_train_ids(stats), (restore or {}).get("shard_num"), saved_in)
    if plan is not None:
        planner.check_fits(cfg, plan)
    return plan


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
        self.done: set[str] = set()
        self._lock = threading.Lock()

    def feed(self, source: str, line: str) -> bool:
        """Take one output line of process ``source``; True when it was an event."""
        tag, _, payload = line.strip().partition(" ")
        if tag not in (PROGRESS, EPOCH, CHECKPOINT, DONE):
            return False
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:  # e.g. native output mixed into the line
            return False
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
                self.echo(f"== checkpoint {event['id']} committed to {event['uri']}{evicted}")
            else:
                self.done.add(source)
        return True
