"""What every launcher backend shares: the job prepared once before it starts, its events, its result.

:func:`prepare_job` resolves what every role must agree on (the checkpoint to restore, the job's plan:
``shard_num``, the data's negative sample rate, the table's memory) before any process starts, the config left as
the user wrote it; a backend (:mod:`components.train.backends`) then starts the roles with
:meth:`PreparedJob.spec`. The roles print events (:mod:`components.ps.contract`),
which :class:`EventLog` turns into progress lines and the :class:`JobResult`, whether they arrive through a
local pipe or a pod's log stream (whether a role is alive is read from the store: :mod:`components.train.liveness`).
:class:`StopSignals` turns SIGTERM, SIGINT and SIGHUP into an exception in the launcher, so that it tears its job
down before it exits.
"""

from __future__ import annotations

import json
import math
import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from components.checkpoint.lease import LeaseLost, StoreLease, new_run_id
from components.checkpoint.protocol import clear_scores
from components.checkpoint.restore import RestoreTarget, restore_target
from components.checkpoint.store import CheckpointStore, CheckpointStoreError
from components.config import CtrConfig, to_dict
from components.days import day_of
from components.ps.contract import CHECKPOINT, DAY_EVAL, EPOCH, PROGRESS, JobPlan, JobSpec, Role, parse_event
from components.ps.liveness import CURVE_KEY, clear_heartbeats
from components.ps.shard_uploader import clear_records
from components.train import planner


class PsJobError(RuntimeError):
    """A PS job failed; ``role`` names the process (or pod) that failed first."""

    def __init__(self, role: str, message: str):
        self.role = role
        super().__init__(message)


class RoleFailed(PsJobError):
    """A role of the job died or stalled: ``what`` happened to it, in one phrase; ``restartable`` unless no whole-job
    restart can mend it (a configuration error)."""

    def __init__(self, role: str, message: str, what: str, restartable: bool):
        super().__init__(role, message)
        self.what, self.restartable = what, restartable


class PsJobStoreError(PsJobError, CheckpointStoreError):
    """A PS job stopped because its checkpoint store failed it (a full disk, no permission, unreachable): the
    user's to fix, so reported in one line (:mod:`pipelines.errors`)."""


class RoleStoreRefused(RoleFailed, PsJobStoreError):
    """A role exited because the checkpoint store refused its write (``STORE_REFUSED_EXIT``): a failed role no
    restart mends, reported in one line like any store error."""

    def __init__(self, role: str, message: str, what: str):
        super().__init__(role, message, what, restartable=False)


def check_lease(lease: Optional[StoreLease], job: str, after: str = "") -> None:
    """Raise :class:`PsJobStoreError` ``"<job>: <why>"`` (then ``after``: what became of the job) when the job's
    store ``lease`` (None: none held) was lost: every backend stops a job that lost it."""
    if lease is None:
        return
    try:
        lease.check()
    except LeaseLost as err:
        raise PsJobStoreError("checkpoint store", f"{job}: {err}{after}") from None


@dataclass
class JobResult:
    epochs: list[dict]
    seconds: float
    checkpoints: list[dict]  # committed during this job, oldest first: {id, epoch, uri}
    restored_from: Optional[RestoreTarget]
    plan: Optional[planner.MemoryPlan] = None  # the sparse table's memory plan (None in geo mode)
    # Local backend: each server's RSS in bytes when it started serving and at its peak while the job ran.
    server_memory: Optional[list[dict]] = None
    curve: Optional[dict[str, list[list[float]]]] = None  # EventLog.curve: the workers' training curves
    day_eval: Optional[dict] = None  # a day's job: the restored model's metrics on the day, before training on it
    restarts: list[dict] = field(default_factory=list)  # whole-job restarts (components.train.restarts.Restart)


@dataclass(frozen=True)
class PreparedJob:
    """A PS job with everything its roles must agree on resolved, derived once before it starts.

    ``cfg``: the user's config, untouched; ``store``: the checkpoint store, cleaned of saves that never committed;
    ``restore``: what the job starts from; ``plan``: what the job resolved (``shard_num``, the data's negative sample
    rate, the table's memory plan, checked to fit: :func:`resolve_plan`); ``run_id``: names the run in its
    checkpoints and its store lease.
    """

    cfg: CtrConfig
    store: CheckpointStore
    restore: Optional[RestoreTarget]
    plan: JobPlan
    run_id: str = field(default_factory=new_run_id)
    baseline: str = ""  # where the roles read the fitted baseline (model.blend_baseline): a path or a URL
    baseline_beside: bool = False  # fitted beside the job: the roles wait for it at ``baseline``

    def spec(self, data_dir: str, workdir: str, staging_dir: str) -> JobSpec:
        """The spec every role of this job gets (see :class:`components.ps.contract.JobSpec`)."""
        return JobSpec(config=to_dict(self.cfg), plan=self.plan, data_dir=data_dir, workdir=workdir,
                       staging_dir=staging_dir, restore=self.restore, run_id=self.run_id, baseline=self.baseline,
                       baseline_beside=self.baseline_beside)

    def lines(self) -> list[str]:
        """What the job starts from and its memory plan, as lines to print before it starts."""
        return ([self.restore.describe()] if self.restore else []) + plan_lines(self.plan.memory)


def prepare_job(cfg: CtrConfig, stats: Optional[dict], run_id: Optional[str] = None,
                store: Optional[CheckpointStore] = None) -> PreparedJob:
    """Resolve what a job starts from and plan its table; raises ConfigError (a table that cannot fit, a
    shard count a restored table refuses) or CheckpointError (a restore target that does not exist) before
    any process starts. ``stats``: the dataset's ``stats.json`` (its distinct ids bound the rows), if readable;
    ``store``: the open checkpoint store of ``checkpoint.uri`` (opened here when not given).

    It cleans the store of what a killed job left (saves that never committed, upload records): call it holding
    the store's lease (:class:`components.checkpoint.lease.StoreLease`, as :func:`components.train.step.launch_ps_job`
    does), or another job's save in progress would go too.
    """
    store = store or CheckpointStore(cfg.checkpoint.uri)
    clean_store(store)
    return plan_job(cfg, stats, store, run_id)


def clean_store(store: CheckpointStore) -> None:
    """Drop what a killed job (or attempt) left in the store: saves that never committed (invisible, but their
    files stay), the upload records and score counts of a checkpoint in progress, the roles' heartbeat records. Only
    its lease's holder may."""
    store.cleanup_incomplete()
    clear_records(store)
    clear_scores(store)
    clear_heartbeats(store)


def plan_job(cfg: CtrConfig, stats: Optional[dict], store: CheckpointStore,
             run_id: Optional[str] = None) -> PreparedJob:
    """The part of :func:`prepare_job` that only reads the store: what a job would start from and its plan
    (``plan=true`` prints it without changing the store)."""
    restore = restore_target(store, cfg.checkpoint.resume, cfg.checkpoint.warm_start, day=day_of(cfg))
    return PreparedJob(cfg, store, restore, resolve_plan(cfg, stats, restore), run_id or new_run_id())


def resolve_plan(cfg: CtrConfig, stats: Optional[dict], restore: Optional[RestoreTarget]) -> JobPlan:
    """The job's plan (:func:`components.train.planner.job_plan`), its table checked to fit; no store needed."""
    plan = planner.job_plan(cfg, stats, restore)
    if plan.memory is not None:
        planner.check_fits(cfg, plan.memory)
    return plan


def plan_lines(plan: Optional[planner.MemoryPlan]) -> list[str]:
    return plan.lines() if plan else ["memory plan: none in geo mode (servers keep a MemorySparseGeoTable, "
                                      "each worker a dense vocab_size x embedding_dim copy)"]


def format_progress(event: dict) -> str:
    if event.get("state") == "saving":
        return (f"[{event['role']} {event['index']}] saving: {event['rows']:,} rows written "
                f"({event['rows_per_s']:,.0f} rows/s)")
    if event.get("state") == "restored":
        return (f"[{event['role']} {event['index']}] restored its tables: download {event['download_s']:.1f}s, "
                f"load {event['load_s']:.1f}s")
    if event.get("state") == "uploading":
        return f"[{event['role']} {event['index']}] uploading: {event['bytes'] / 2 ** 20:,.1f} MiB sent"
    if event.get("state"):
        return f"[{event['role']} {event['index']}] {event['state']}"
    loss = event.get("loss")
    return (f"[worker {event['index']}] epoch {event['epoch']} | {event['examples']:,} examples | "
            f"{event['examples_per_s']:,.0f} ex/s | loss {loss:.4f} | auc {event['auc']:.4f}"
            if loss is not None else f"[worker {event['index']}] epoch {event['epoch']} | {event['examples']:,} examples")


def format_epoch(event: dict) -> str:
    return (f"== epoch {event['epoch']} done: {event['examples']:,} examples in {event['seconds']:.1f}s, "
            f"global train AUC {event['auc']:.4f}")


def format_day_eval(event: dict) -> str:
    metrics = event["metrics"]
    return (f"== day {event['day']!r} before training on it: auc {metrics['auc']:.4f}, logloss "
            f"{metrics['logloss']:.4f}, calibration {metrics['calibration']:.4f} on its {metrics['count']:,} rows "
            f"(the model of checkpoint {event['checkpoint']}; {event['seconds']:.1f}s)")


# Points a worker's training curve keeps: past twice this many, every other point goes (a curve of hours stays small
# enough for the Model artifact's metadata, and keeps its shape).
CURVE_POINTS = 200


class EventLog:
    """Collects the events of a job's processes and echoes them as readable lines (thread-safe).

    ``curve``: each worker's progress reports as ``[examples it trained so far, over all passes, running loss,
    AUC]`` points: the job's training curve. ``structured``: progress and pass events are echoed as the event lines
    themselves (without the curve's samples), for a reader that takes events (the local run's console, which
    writes the readable line to the run's log), not text to parse back.
    """

    def __init__(self, echo: Callable[[str], None], structured: bool = False):
        self.echo, self.structured = echo, structured
        self.progress: dict[str, dict] = {}
        self.curve: dict[str, list[list[float]]] = {}
        self._passes: dict[str, dict[int, int]] = {}  # worker -> pass -> the most examples it reported in it
        self.epochs: list[dict] = []
        self.checkpoints: list[dict] = []
        self.day_eval: Optional[dict] = None
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
                self._add_to_curve(source, event)
                self.echo(self._shown(tag, event, format_progress))
            elif tag == EPOCH:
                # A restarted job retrains from its last checkpoint: a pass reported again replaces the old report.
                self.epochs = [e for e in self.epochs if e["epoch"] < event["epoch"]] + [event]
                self.echo(self._shown(tag, event, format_epoch))
            elif tag == DAY_EVAL:
                self.day_eval = event
                self.echo(format_day_eval(event))
            elif tag == CHECKPOINT:
                self.checkpoints.append(event)
                evicted = (f" ({event['evicted']:,} rows evicted since the last checkpoint)"
                           if event.get("evicted") is not None else "")
                validation = event.get("validation")
                judged = (f"; validation auc {validation['auc']:.4f}, logloss {validation['logloss']:.4f}"
                          f"{' (best so far)' if event.get('best') else ''}{', stopping' if event.get('stop') else ''}"
                          if validation else "")
                seconds = event.get("seconds") or {}
                rate = event.get("save_rows_per_s_per_server")
                timing = (f" [{event['rows']:,} rows; save {seconds['save_s']:.1f}s"
                          f"{f' ({rate:,.0f} rows/s per server)' if rate else ''}, scoring {seconds['score_s']:.1f}s, "
                          f"upload and commit {seconds['upload_s']:.1f}s]" if seconds else "")
                self.echo(f"== checkpoint {event['id']} committed to {event['uri']}{evicted}{judged}{timing}")
        return True

    def _shown(self, tag: str, event: dict, readable: Callable[[dict], str]) -> str:
        if not self.structured:
            return readable(event)
        return f"{tag} {json.dumps({k: v for k, v in event.items() if k != CURVE_KEY})}"

    def new_attempt(self) -> None:
        """A restarted job's processes start under the old names: how far the failed attempt's went must not stand
        for their progress."""
        with self._lock:
            self.progress.clear()

    def _add_to_curve(self, source: str, event: dict) -> None:
        # Before a worker's first batch it reports no loss, and early in a pass the AUC can be NaN (one class seen
        # so far): no curve point keeps either.
        if event.get("role") != Role.WORKER.value:
            return
        # The worker's samples since its last event (components.ps.liveness.CURVE_KEY), else the event itself.
        samples = event.get(CURVE_KEY) or [[event.get("examples"), event.get("loss"), event.get("auc")]]
        samples = [s for s in samples if s[0] is not None and all(v is not None and math.isfinite(v) for v in s[1:])]
        if not samples:
            return
        passes = self._passes.setdefault(source, {})
        passes[event["epoch"]] = max(passes.get(event["epoch"], 0), int(samples[-1][0]))
        # A restarted job retrains from its checkpoint: the examples of the passes before this one, as reported.
        before = sum(n for epoch, n in passes.items() if epoch < event["epoch"])
        points = self.curve.setdefault(source, [])
        points.extend([before + int(examples), float(loss), float(auc)] for examples, loss, auc in samples)
        if len(points) > 2 * CURVE_POINTS:
            points[:] = points[::2]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopSignals:
    """While active in the main thread, SIGTERM, SIGINT and SIGHUP raise ``make_error(signum)`` there, once.

    After :meth:`hold` (a teardown has begun) a signal is kept instead and raised when the block ends, so the
    teardown is not cut short. Outside the main thread (where Python cannot set handlers) it does nothing.
    """

    def __init__(self, make_error: Callable[[int], BaseException]):
        self.make_error = make_error
        self.signum: Optional[int] = None
        self._held = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def hold(self) -> None:
        self._held = True

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:  # a second signal: the teardown the first one started is under way
            return
        self.signum = signum
        if not self._held:
            raise self.make_error(signum)

    def __exit__(self, exc_type, exc, tb) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)  # None: set outside Python
        if self.signum is not None and self._held and exc_type is None:
            raise self.make_error(self.signum)
