"""What the train step runs: plain functions around the PS job's backends (no KFP needed).

The checkpoint is not copied into the artifact store: the job writes it to ``cfg.checkpoint.uri``, and the
``Model`` artifact points at it (:mod:`components.checkpoint.pointer`). The processes' logs go into the
``logs`` artifact directory as ``<role>-<i>.log``.
"""

import contextlib
import dataclasses
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from components.checkpoint.days import DayLedger, describe_day
from components.checkpoint.lease import StoreLease, new_run_id
from components.checkpoint.pointer import write_pointer
from components.checkpoint.restore import warning
from components.checkpoint.store import CheckpointStore
from components.checkpoint.verify import checkpoint_problem, describe_skipped
from components.config import ClusterBackend, CtrConfig, from_dict
from components.config_rules import is_remote_uri
from components.days import day_of
from components.networks.baseline_handoff import handoff_uri
from components.ps.liveness import driver_from_env, stop_when_gone
from components.train.backends.base import JobBackend, StepInputs
from components.train.fit_beside import fitting_beside
from components.train.job import JobResult, prepare_job
from components.train.planner import GIB, load_balance_lines, max_over_mean, size


def echo_now(line: str) -> None:
    """Print and flush: a task's stdout is a pipe (block-buffered), and progress must show as it happens."""
    print(line, flush=True)


def _local_backend() -> type[JobBackend]:
    from components.train.backends.local import LocalJob

    return LocalJob


def _kubernetes_backend() -> type[JobBackend]:
    # Imported when used: only this backend needs the kubernetes client.
    from components.train.backends.kubernetes.lifecycle import KubernetesJob

    return KubernetesJob


# Each cluster.backend's class, loaded on first use.
BACKENDS: dict[ClusterBackend, Callable[[], type[JobBackend]]] = {
    ClusterBackend.local: _local_backend,
    ClusterBackend.trainjob: _kubernetes_backend,
    ClusterBackend.jobset: _kubernetes_backend,
    ClusterBackend.paddlejob: _kubernetes_backend,
}


@dataclass(frozen=True)
class Baseline:
    """The fitted baseline (:mod:`components.evaluate.baseline_step`): its directory on this machine and, when
    stored remotely (the fit-baseline step's ``Model`` artifact), its URL. ``beside``: fitted beside the job and
    published at ``uri`` while it trains, where the roles wait for it (:meth:`fitted_beside`); ``fitted_here``: by
    this step, beside its local processes (:mod:`components.train.fit_beside`), unless published there already."""

    path: str
    uri: Optional[str] = None
    beside: bool = False
    fitted_here: bool = False

    @classmethod
    def fitted_beside(cls, cfg: CtrConfig, root: str, data_uri: str, here: bool = False) -> "Baseline":
        """The baseline of the dataset at ``data_uri`` that a fit beside the job publishes under ``root``;
        ``here``: this step fits it."""
        if here and cfg.cluster.backend is not ClusterBackend.local:
            raise ValueError(f"the train step fits the baseline beside local processes only, not beside "
                             f"cluster.backend={cfg.cluster.backend.value}'s")
        uri = handoff_uri(root, data_uri, cfg.eval.baseline_rows, cfg.eval.baseline_features)
        return cls("", uri, beside=True, fitted_here=here)

    def for_roles(self, backend: ClusterBackend) -> str:
        """Where the roles of ``backend`` read it: local processes here, pods at its URL; the roles of a job it is
        fitted beside, where it is published."""
        if self.beside:
            return self.uri
        if backend is ClusterBackend.local:
            return self.path
        from components.train.backends.manifests import pod_data_uri

        if not is_remote_uri(self.uri):
            raise ValueError(f"cluster.backend={backend.value} needs the fitted baseline at a remote fsspec URL the "
                             f"pods can read (the fit-baseline step's artifact), got {self.uri!r}")
        return pod_data_uri(self.uri)


def fit_here(cfg: CtrConfig, data_dir: Path, out_dir: str, echo: Callable[[str], None]) -> Baseline:
    """Fit the baseline the delivered model blends in, on this machine (a job launched without the pipeline's step)."""
    from components.evaluate.baseline_step import fit_baseline

    started = time.time()
    fit = fit_baseline(data_dir, cfg.eval.baseline_rows, cfg.eval.baseline_features, out_dir)
    echo(f"== baseline for the blend: fitted on {fit['baseline_rows']:,} rows in "
         f"{time.time() - started:.1f}s")
    return Baseline(out_dir)


def launch_ps_job(cfg: CtrConfig, data_dir: Path, log_dir: Path, echo: Callable[[str], None] = echo_now,
                  data_uri: Optional[str] = None, store: Optional[CheckpointStore] = None,
                  baseline: Optional[Baseline] = None) -> JobResult:
    """Prepare the PS job of ``cfg`` once and run it on ``cluster.backend`` (:data:`BACKENDS`), the one dispatch
    to the backends.

    ``data_dir`` is the prepared dataset on this machine (local processes read it; its stats.json sizes the
    memory plan); ``data_uri`` is where it is stored remotely (the ``Dataset`` artifact's URI), which pods on
    Kubernetes fetch their shards from.

    The job holds the checkpoint store's lease while it runs (:mod:`components.checkpoint.lease`): a store
    another job is using is refused with :class:`~components.checkpoint.lease.StoreInUse`, naming that job.
    Started by a local pipeline run (``$CTR_DRIVER_PID``), this process stops its job when the driver dies.
    ``store``: the open checkpoint store of ``checkpoint.uri`` (opened here when not given). ``baseline``: the
    fit-baseline step's, which a model that blends it in (``model.blend_baseline``) scores with; without
    one, it is fitted here (local processes only: pods read it from the step's artifact, which the Kubernetes
    backends require).
    """
    stop_when_gone(driver_from_env())
    with tempfile.TemporaryDirectory(prefix="ctr-baseline-") as fitted_here:
        if cfg.model.blend_baseline and baseline is None and cfg.cluster.backend is ClusterBackend.local:
            baseline = fit_here(cfg, data_dir, fitted_here, echo)
        fitting = (fitting_beside(data_dir, cfg.eval.baseline_rows, cfg.eval.baseline_features, baseline.uri,
                                  Path(fitted_here), log_dir, echo)
                   if baseline is not None and baseline.fitted_here else contextlib.nullcontext())
        with fitting:
            return _launch(cfg, data_dir, log_dir, echo, data_uri, store, baseline)


def _launch(cfg: CtrConfig, data_dir: Path, log_dir: Path, echo: Callable[[str], None], data_uri: Optional[str],
            store: Optional[CheckpointStore], baseline: Optional[Baseline]) -> JobResult:
    stats_path = Path(data_dir) / "stats.json"
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else None
    run_id = new_run_id()
    store = store or CheckpointStore(cfg.checkpoint.uri)
    with StoreLease(store, run_id) as lease:
        job = prepare_job(cfg, stats, run_id, store)
        if cfg.model.blend_baseline and baseline is not None:
            job = dataclasses.replace(job, baseline=baseline.for_roles(cfg.cluster.backend),
                                      baseline_beside=baseline.beside)
        inputs = StepInputs(data_dir=Path(data_dir), data_uri=data_uri, log_dir=Path(log_dir), echo=echo, lease=lease)
        return BACKENDS[cfg.cluster.backend]().for_step(job, inputs).run()


def delivered_checkpoint(result: JobResult, store: CheckpointStore) -> str:
    """The checkpoint the run delivers: the best on the validation split (the store's ``BEST``, which may predate a
    resume) when the job validated its checkpoints, else the last.

    A best that predates this job is checked whole first: corrupt since (a changed byte in its scores), it would
    fail the evaluation after the job trained; this job's last checkpoint, just committed, is delivered instead,
    with one warning line."""
    last = result.checkpoints[-1]["id"]
    if any(c.get("validation") for c in result.checkpoints):
        best = store.best()
        if best and best not in {c["id"] for c in result.checkpoints}:
            problem = checkpoint_problem(store, best)
            if problem is not None:
                warning(f"{describe_skipped(store, [(best, problem)])}: delivering {last}, this job's last "
                        "checkpoint, instead of that best on the validation split")
                return last
        if best:
            return best
    return last


def training_summary(result: JobResult, store: CheckpointStore) -> dict:
    """What the Model artifact records about the run (JSON-safe): the store and the delivered checkpoint's id."""
    examples = sum(int(e["examples"]) for e in result.epochs)
    train_seconds = sum(float(e["seconds"]) for e in result.epochs)
    if not result.checkpoints:
        raise RuntimeError(f"the PS job committed no checkpoint to {store.uri} (nothing left to train "
                           f"after resuming from {result.restored_from.id if result.restored_from else None}?)")
    delivered = delivered_checkpoint(result, store)
    summary = {
        "uri": store.uri,
        "id": delivered,
        "last_id": result.checkpoints[-1]["id"],
        "stopped_early": any(c.get("stop") for c in result.checkpoints),
        "restored_from": result.restored_from.id if result.restored_from else None,
        "epochs": len(result.epochs),
        "examples": examples,
        "seconds": round(float(result.seconds), 3),
        "examples_per_s": round(examples / train_seconds, 1) if train_seconds > 0 else None,
    }
    if result.epochs:
        summary["final_train_auc"] = float(result.epochs[-1]["auc"])
    validation = next((c["validation"] for c in result.checkpoints if c["id"] == delivered and c.get("validation")),
                      None)
    if validation:
        summary["validation_auc"], summary["validation_logloss"] = validation["auc"], validation["logloss"]
    if result.plan:
        summary["memory_plan"] = result.plan.summary()
    load = result.checkpoints[-1].get("servers")
    if load:
        summary["server_rows"] = load["rows"]
        summary["server_rows_max_over_mean"] = round(max_over_mean(load["rows"]), 4)
    if result.server_memory and all(result.server_memory):
        summary["server_peak_rss_gib"] = [round(m["peak_rss"] / GIB, 3) for m in result.server_memory]
    if result.restarts:  # what the faults cost: each restart, and the examples trained again after them
        summary["restarts"] = result.restarts
        summary["examples_trained_twice"] = sum(r["examples_again"] for r in result.restarts)
    if result.day_eval:
        summary["day_eval"] = result.day_eval
    if result.curve:
        summary["curve"] = {worker: [[examples, round(loss, 5), round(auc, 5)] for examples, loss, auc in points]
                            for worker, points in result.curve.items()}
    return summary


def record_day(day: str, result: JobResult, summary: dict, data_dir: Path, store: CheckpointStore) -> dict:
    """Record a trained day in the store's ledger (:mod:`components.checkpoint.days`): its ``days.csv`` row, its
    data's drift summary and its train ids. Returns the row."""
    from components.data_prep.prepare import read_distinct_ids

    stats = json.loads((data_dir / "stats.json").read_text())
    drift = (stats.get("drift") or {}).get("summary")
    evaluated = (summary.get("day_eval") or {}).get("metrics") or {}
    delivered = next((c for c in result.checkpoints if c["id"] == summary["id"]), result.checkpoints[-1])
    evicted = [c.get("evicted") for c in result.checkpoints]
    row = {"day": day, "train_rows": stats["rows"]["train"], "eval_auc": evaluated.get("auc"),
           "eval_logloss": evaluated.get("logloss"), "eval_calibration": evaluated.get("calibration"),
           "train_auc": summary.get("final_train_auc"), "table_rows": delivered.get("rows"),
           "evicted_rows": sum(e for e in evicted if e is not None) if any(e is not None for e in evicted) else None,
           "new_id_fraction": (drift or {}).get("new_id_fraction"), "seconds": summary["seconds"],
           "checkpoint": summary["id"]}
    DayLedger(store).record(row, drift, read_distinct_ids(data_dir))
    return row


def server_report(result: JobResult) -> list[str]:
    """After training: where the rows of the last checkpoint live and, for local servers, what they held."""
    lines = []
    load = result.checkpoints[-1].get("servers") if result.checkpoints else None
    if load and result.plan:
        lines += load_balance_lines(load, result.plan)
    if result.server_memory and all(result.server_memory):
        planned = f" (planned {size(result.plan.server_bytes)})" if result.plan else ""
        lines.append("server RSS: serving " + " | ".join(size(m["serving_rss"]) for m in result.server_memory)
                     + ", peak " + " | ".join(size(m["peak_rss"]) for m in result.server_memory) + planned)
    return lines


def train_model(config: Any, data_dir: str, pointer_path: str, log_dir: str,
                echo: Callable[[str], None] = echo_now, data_uri: Optional[str] = None,
                baseline: Optional[Baseline] = None, baseline_root: str = "", fits_baseline: bool = False) -> dict:
    """Run the PS job of ``config`` on ``data_dir`` (stored at ``data_uri``: the Kubernetes backends need it);
    returns the summary for the Model artifact. ``baseline_root``: the baseline is fitted beside this step and
    published under it (:meth:`Baseline.fitted_beside`), by this step when ``fits_baseline``.

    The checkpoint goes to ``checkpoint.uri``; the pointer file to ``pointer_path``; the logs to
    ``log_dir`` (the launcher's per-role scratch directories are dropped from it after a successful job).
    """
    cfg = from_dict(config)
    store = CheckpointStore(cfg.checkpoint.uri)  # opened once for the step: the job, its summary, the day's ledger
    if baseline_root:
        baseline = Baseline.fitted_beside(cfg, baseline_root, data_uri, here=fits_baseline)
    result = launch_ps_job(cfg, Path(data_dir), Path(log_dir), echo=echo, data_uri=data_uri, store=store,
                           baseline=baseline)
    shutil.rmtree(Path(log_dir) / "work", ignore_errors=True)  # kept on failure, for debugging
    summary = training_summary(result, store)
    day = day_of(cfg)
    if day is not None:
        summary["day"] = record_day(day, result, summary, Path(data_dir), store)
        echo(f"== day {day!r}: {describe_day(summary['day'])}")
    write_pointer(pointer_path, summary)
    for line in server_report(result):
        echo(line)
    how = (f"the best on the validation split (auc {summary['validation_auc']:.4f})" if "validation_auc" in summary
           else "the last")
    stopped = ", stopped early" if summary["stopped_early"] else ""
    echo(f"checkpoint: {summary['id']} in {cfg.checkpoint.uri}, {how} ({summary['epochs']} epoch(s) this run"
         f"{stopped}, {summary['seconds']:.1f}s, {summary['examples_per_s'] or 0:,.0f} examples/s)")
    return summary


