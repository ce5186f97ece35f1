"""Day-by-day training on this machine: one local pipeline run per day, in order, continuing one checkpoint store.

``python -m pipelines.ctr data=criteo "data.uri='<dir>/day_{day}.tsv'" data.days=[0,1,2,3]`` trains day 0, then
day 1 from the model day 0 delivered, and so on (README: day-by-day training). Each day's run is the pipeline of
:mod:`pipelines.pipeline` with ``data.day`` set, in ``<run_dir>/days/<day>/``; before training on its day, the PS job
scores the model it continues on that day's rows (the next-day metric), and once the day is trained the train step
records it in the store's ledger (:mod:`components.checkpoint.days`), from which the evaluation writes ``days.csv``
and ``days.png``. The run directory gets the last day's files (its test metrics are the run's).

Days the store has trained already are skipped (one line each), so a rerun goes on with the first untrained day; a
day out of order with the store's is refused before anything runs.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

from components.checkpoint.days import DayLedger, DayOrderError
from components.checkpoint.store import CheckpointStore
from components.config import ConfigError, CtrConfig
from components.days import expand_days
from pipelines.result import RunResult

# A day's name as a directory name: a day may be a glob (``[0-2]``, several files as one day) or hold a slash.
_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")


def plan_days(cfg: CtrConfig) -> tuple[list[str], list[str]]:
    """``(days the store has trained already, days to train)``; ConfigError naming the day when one is out of
    order with the store's."""
    ledger = DayLedger(CheckpointStore(cfg.checkpoint.uri))
    try:
        return ledger.plan(expand_days(cfg.data.days or []))
    except DayOrderError as err:
        raise ConfigError("data.days", list(cfg.data.days or []), "days after the ones the store has trained",
                          str(err)) from None


def day_config(cfg: CtrConfig, day: str) -> CtrConfig:
    """The run of one day: ``data.day`` set, its own directory under the run's."""
    return dataclasses.replace(cfg, run_dir=str(Path(cfg.run_dir) / "days" / _UNSAFE.sub("_", day)),
                               data=dataclasses.replace(cfg.data, day=day))


def run_days_locally(cfg: CtrConfig) -> RunResult:
    """Train ``cfg.data.days`` in order, one local pipeline run each; returns the last trained day's test metrics
    and checkpoint, with the run's report (the last day's, copied up); nothing measured when every day was trained
    already."""
    from components.evaluate.days import DAYS_CSV, DAYS_PNG  # the report's plotting: not for plan=true
    from pipelines.local import REPORT_FILE, run_pipeline_locally

    done, todo = plan_days(cfg)
    ledger = DayLedger(CheckpointStore(cfg.checkpoint.uri))
    for day in done:
        entry = ledger.entry(day) or {}
        print(f"day {day!r}: trained already (checkpoint {entry.get('checkpoint')}), skipped", flush=True)
    if not todo:
        print("every day of data.days is trained already: nothing to do", flush=True)
        return RunResult(metrics={}, run_dir=Path(cfg.run_dir))
    for n, day in enumerate(todo, 1):
        print(f"\n==== day {day!r} ({n} of {len(todo)} to train; {len(done) + n} of {len(done) + len(todo)})",
              flush=True)
        day_cfg = day_config(cfg, day)
        Path(day_cfg.run_dir).mkdir(parents=True, exist_ok=True)
        day_run = run_pipeline_locally(day_cfg)
        for name in (DAYS_CSV, DAYS_PNG):  # the table and plot of every day so far
            produced = Path(day_cfg.run_dir) / name
            if produced.is_file():
                shutil.copyfile(produced, Path(cfg.run_dir) / name)
    for name in ("metrics.json", "report.md", REPORT_FILE):  # the last day's are the run's
        shutil.copyfile(day_run.run_dir / name, Path(cfg.run_dir) / name)
    return dataclasses.replace(day_run, run_dir=Path(cfg.run_dir), report=Path(cfg.run_dir) / REPORT_FILE)
