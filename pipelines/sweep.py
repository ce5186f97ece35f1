"""Hydra multirun sweeps: ``python -m pipelines.ctr -m model=dnn,deepfm table.embedding_dim=8,16``.

Every job runs the whole pipeline (locally one at a time, each PS job on fresh ports; on Kubeflow one run
per job). A job that fails is recorded and the sweep goes on: :func:`run_sweep_job` reports the error in
one line, leaves it in the job's directory (``error.txt``) and returns the worst possible objective
(-inf for AUC, +inf for logloss), so an adaptive sweeper steers away from it. :class:`SweepSummary`, a Hydra callback, records each job as it ends
(``jobs.jsonl``) and at the end writes the sweep directory's summary::

    summary.csv   one row per job: number, status, the swept overrides, objective, metrics, Kubeflow run id
    summary.md    the same as a Markdown table, best job first (also printed)
    summary.png   the objective per job

The sweep exits with status 1 if any job failed, after the summary is written.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict

from components.config_rules import is_remote_uri
from components.redaction import redact

ERROR_FILE = "error.txt"
JOBS_FILE = "jobs.jsonl"
METRIC_COLUMNS = ("auc", "logloss", "calibration", "auc_ratio_to_bayes")
# The direction each objective is optimised in (an Optuna sweeper must agree).
DIRECTIONS = {"auc": "maximize", "logloss": "minimize"}


def in_sweep() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode is RunMode.MULTIRUN


def sweep_checkpoint_uri(uri: str, sweep_dir: str, job_num: int) -> str:
    """A remote checkpoint store per job: jobs sharing one would resume from and prune each other's.
    (A local ``checkpoint.uri`` is already per job: it is relative to the job's directory.)"""
    if not is_remote_uri(uri):
        return uri
    sweep = "_".join(Path(sweep_dir).parts[-2:])
    return f"{uri.rstrip('/')}/{sweep}/{job_num}"


def check_sweeper_direction(objective: str) -> None:
    """An Optuna sweeper optimising the wrong way would search for the worst model."""
    sweeper = HydraConfig.get().sweeper
    direction = sweeper.get("direction") if "direction" in sweeper else None
    if direction is not None and str(direction).lower() != DIRECTIONS[objective]:
        from components.config import ConfigError

        raise ConfigError("hydra.sweeper.direction", str(direction), DIRECTIONS[objective],
                          f"objective={objective} is to be {DIRECTIONS[objective]}d")


def run_sweep_job(cfg: DictConfig, run: Callable[[DictConfig], float]) -> float:
    """One job of a sweep: its own checkpoint store, failures recorded instead of raised."""
    hydra = HydraConfig.get()
    run_dir = Path(hydra.runtime.output_dir)
    try:
        check_sweeper_direction(cfg.objective)
        with open_dict(cfg):
            cfg.checkpoint.uri = sweep_checkpoint_uri(cfg.checkpoint.uri, hydra.sweep.dir, hydra.job.num)
        return run(cfg)
    except Exception as err:  # noqa: BLE001 - any failure of one job must not end the sweep
        headline = error_headline(err)
        print(f"error: sweep job {hydra.job.num} failed: {headline}", file=sys.stderr, flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ERROR_FILE).write_text(f"{headline}\n\n{type(err).__name__}: {err}\n")
        return worst_objective(str(cfg.objective))


def worst_objective(objective: str) -> float:
    """What a failed job returns: the worst possible value, so an adaptive sweeper steers away from it
    (Optuna 2.10 cannot record a NaN trial through hydra-optuna-sweeper 1.3)."""
    return float("-inf") if DIRECTIONS.get(objective, "maximize") == "maximize" else float("inf")


def error_headline(err: Exception) -> str:
    """One line saying why a job failed: a failed pipeline step adds its own error's first line."""
    headline = f"{type(err).__name__}: {err}".splitlines()[0]
    step_error = getattr(err, "step_error", "").strip()  # PipelineRunError: the step's exception
    return f"{headline} {step_error.splitlines()[0]}" if step_error else headline


def _job_record(job_return: JobReturn, seconds: float) -> dict:
    hydra = job_return.hydra_cfg.hydra
    job_dir = Path(hydra.runtime.output_dir)
    error_file = job_dir / ERROR_FILE
    if job_return.status is not JobStatus.COMPLETED:
        status, error = "failed", f"{type(job_return._return_value).__name__}: {job_return._return_value}"
    elif error_file.exists():
        status, error = "failed", error_file.read_text().strip()
    else:
        status, error = "completed", ""
    objective = job_return._return_value if status == "completed" else None
    metrics_file = job_dir / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if status == "completed" and metrics_file.exists() else {}
    run_file = job_dir / "kubeflow_run.json"
    kubeflow = json.loads(run_file.read_text()) if run_file.exists() else {}
    return {"job": int(hydra.job.num), "status": status, "overrides": [redact(o) for o in job_return.overrides or []],
            "objective": None if objective is None or not math.isfinite(objective) else float(objective),
            "metrics": {k: metrics[k] for k in METRIC_COLUMNS if metrics.get(k) is not None},
            "seconds": round(seconds, 1), "dir": str(job_dir), "error": redact(error.splitlines()[0]) if error else "",
            "kubeflow_run_id": kubeflow.get("run_id", ""), "kubeflow_url": kubeflow.get("url", "")}


def _split_overrides(records: list[dict]) -> tuple[list[str], list[str]]:
    """(keys that vary across jobs: the table's columns, overrides every job shares: stated once)."""
    values: dict[str, set] = {}
    for record in records:
        for override in record["overrides"]:
            key, _, value = override.partition("=")
            values.setdefault(key, set()).add(value)
    varying = [key for key, seen in values.items() if len(seen) > 1 or any(
        not any(o.partition("=")[0] == key for o in r["overrides"]) for r in records)]
    shared = sorted({o for r in records for o in r["overrides"] if o.partition("=")[0] not in varying})
    return varying, shared


def rank(records: list[dict], objective: str) -> list[dict]:
    """Best first by the objective; failed jobs last, in job order."""
    sign = -1 if DIRECTIONS[objective] == "maximize" else 1
    return sorted(records, key=lambda r: (r["objective"] is None, sign * (r["objective"] or 0.0), r["job"]))


def write_summary(sweep_dir: Path, records: list[dict], objective: str) -> str:
    """Write summary.csv / summary.md / summary.png into ``sweep_dir``; returns the Markdown."""
    ranked = rank(records, objective)
    varying, shared = _split_overrides(ranked)
    metric_keys = [k for k in METRIC_COLUMNS if any(k in r["metrics"] for r in ranked)]
    # Columns no job has a value for (no Kubeflow run, no failure) are left out.
    extra = [k for k in ("kubeflow_run_id", "error") if any(r[k] for r in ranked)]
    header = ["rank", "job", "status", *varying, f"objective ({objective})", *metric_keys, "seconds", *extra]
    rows = []
    for i, r in enumerate(ranked, 1):
        swept = dict(o.partition("=")[::2] for o in r["overrides"])
        rows.append([i if r["objective"] is not None else "", r["job"], r["status"],
                     *[swept.get(k, "") for k in varying], _fmt(r["objective"]),
                     *[_fmt(r["metrics"].get(k)) for k in metric_keys], r["seconds"], *[r[k] for k in extra]])
    with open(sweep_dir / "summary.csv", "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows(rows)
    failed = sum(r["status"] == "failed" for r in ranked)
    lines = [f"# Sweep summary: {len(ranked)} job(s), {len(ranked) - failed} completed, {failed} failed",
             "", f"Objective: test {objective} ({DIRECTIONS[objective]}), best first."]
    if shared:
        lines.append("Every job: " + " ".join(f"`{o}`" for o in shared))
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    markdown = "\n".join(lines) + "\n"
    (sweep_dir / "summary.md").write_text(markdown)
    _plot(sweep_dir / "summary.png", records, varying, objective)
    return markdown


def _fmt(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.4f}"


def _plot(path: Path, records: list[dict], varying: list[str], objective: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(records, key=lambda r: r["job"])
    labels = []
    for r in ordered:
        swept = dict(o.partition("=")[::2] for o in r["overrides"])
        labels.append(f"{r['job']}: " + ", ".join(f"{k.rsplit('.', 1)[-1]}={swept.get(k, '')}" for k in varying))
    values = [r["objective"] if r["objective"] is not None else 0.0 for r in ordered]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(ordered) + 2), 4))
    bars = ax.bar(range(len(ordered)), values, color=["tab:blue" if r["objective"] is not None else "white"
                                                      for r in ordered], edgecolor="tab:blue")
    for bar, r in zip(bars, ordered):
        text = "failed" if r["objective"] is None else f"{r['objective']:.4f}"
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=8, color="tab:red" if r["objective"] is None else "black")
    done = [v for v, r in zip(values, ordered) if r["objective"] is not None]
    if done:  # zoom on the differences between jobs, which are small next to the metric's range
        span = max(done) - min(done) or abs(max(done)) * 0.05 or 1.0
        ax.set_ylim(max(0.0, min(done) - span), max(done) + span)
    ax.set_xticks(range(len(ordered)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"test {objective}")
    ax.set_title(f"Sweep: test {objective} per job ({DIRECTIONS[objective]})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class SweepSummary(Callback):
    """Records every job of a multirun as it ends and writes the sweep summary at the end."""

    def __init__(self) -> None:
        self._started: dict[int, float] = {}

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if in_sweep():
            self._started[HydraConfig.get().job.num] = time.time()

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if job_return.hydra_cfg is None or job_return.hydra_cfg.hydra.mode is not RunMode.MULTIRUN:
            return
        num = int(job_return.hydra_cfg.hydra.job.num)
        record = _job_record(job_return, time.time() - self._started.pop(num, time.time()))
        sweep_dir = Path(job_return.hydra_cfg.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with open(sweep_dir / JOBS_FILE, "a") as out:  # appended as jobs end: a crash keeps what finished
            out.write(json.dumps(record) + "\n")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs_file = sweep_dir / JOBS_FILE
        if not jobs_file.exists():
            return
        records = [json.loads(line) for line in jobs_file.read_text().splitlines() if line.strip()]
        markdown = write_summary(sweep_dir, records, config.objective)
        print("\n" + markdown + f"\nsummary: {sweep_dir / 'summary.md'} (also summary.csv, summary.png)", flush=True)
        if any(r["status"] == "failed" for r in records):
            sys.exit(1)
