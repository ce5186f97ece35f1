"""What a person sees of a local run, and what its log file keeps.

Every line the steps print (re-printed by ``kfp.local``: the effective config, KFP's executor chatter, the PS
job's lines) goes to the run's log file. The screen gets the run's shape: a header (:func:`header_lines`), one
line per finished step with its duration, a progress bar per training pass, and the driver's summary table.
``verbose=true`` puts every line on the screen as well, as before.

The pass's progress is that of all workers together: the examples they report of the train rows data prep
counted, their summed rate, the ETA at that rate, and their running loss and AUC weighted by their examples. On
a terminal it is a ``rich`` progress bar, redrawn; elsewhere (a pipe, ``CI=true``) a plain line at most every
``ps.progress_period_s`` or :data:`PLAIN_LINE_PERIOD_S`, whichever is longer, and one when a pass ends.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, TextIO

from components.config import CtrConfig, DataSource
from components.ps.contract import EPOCH, PROGRESS, parse_event
from components.ps.tls import plaintext_warning
from components.train.job import format_epoch, format_progress

ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP_STARTED = re.compile(r" - INFO - Executing task '(?P<step>[\w-]+)'")
SPLIT_NAMES = {"valid": "validation"}
# Plain progress lines come at most this often (and not more often than the workers report): a log stays readable.
PLAIN_LINE_PERIOD_S = 5.0
# A step's lines shown as they are: a day's next-day metrics and its summary (day-by-day training), drift warnings,
# a PS job's whole-job restarts (components.train.restarts).
_SHOWN = re.compile(r"^\s*(?P<line>== day '.*|warning: .*|restart \d+ of \d+: .*)$")
_STEP_ENDED = re.compile(r" - (?:INFO|ERROR) - Task '(?P<step>[\w-]+)' finished with status (?P<status>\w+)")


def interactive(stream: TextIO) -> bool:
    """A terminal, and not a CI job (which may fake one): a redrawn bar; else plain lines."""
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    return bool(getattr(stream, "isatty", lambda: False)()) and not ci


def log_path(run_dir: Path) -> Path:
    """The run's log file: Hydra's (``<run_dir>/<job name>.log``), where the driver's own log records go; a run
    started without Hydra's logging (a test calling :func:`pipelines.ctr.run`) gets ``run_dir/run.log``."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == run_dir:
            return Path(handler.baseFilename)
    return run_dir / "run.log"


def header_lines(cfg: CtrConfig) -> list[str]:
    data = cfg.data
    what = (f"synthetic data, {data.rows:,} rows" if data.source is DataSource.synthetic
            else f"{data.uri} (data.format={data.format.value}; rows counted by data prep)")
    ps = cfg.ps
    plaintext = plaintext_warning(cfg)
    return [f"CTR pipeline: {what}",
            f"  model {cfg.model.name.value} | mode {ps.mode.value} | {ps.servers} server(s) x {ps.workers} worker(s) "
            f"| up to {ps.epochs} epoch(s)",
            *([f"  {plaintext}"] if plaintext else []),
            f"  outputs {cfg.run_dir} (log: {log_path(Path(cfg.run_dir)).name})"]


@dataclass
class PassProgress:
    """One training pass, all workers together; once it ended, as its epoch event says."""

    epoch: int
    total: Optional[int]  # the train rows data prep counted (None: unknown)
    workers: dict[int, dict] = field(default_factory=dict)  # worker index -> its latest progress event
    ended: Optional[dict] = None  # the pass's epoch event: its examples, seconds and global train AUC

    @property
    def examples(self) -> int:
        if self.ended:
            return self.ended["examples"]
        return sum(event["examples"] for event in self.workers.values())

    @property
    def examples_per_s(self) -> float:
        if self.ended:
            return self.ended["examples"] / max(self.ended["seconds"], 1e-9)
        return sum(event.get("examples_per_s", 0.0) for event in self.workers.values())

    def weighted(self, key: str) -> Optional[float]:
        reported = [e for e in self.workers.values() if e.get(key) is not None and e["examples"] > 0]
        seen = sum(e["examples"] for e in reported)
        return sum(e[key] * e["examples"] for e in reported) / seen if seen else None

    @property
    def eta_s(self) -> Optional[float]:
        if self.ended or not self.total or not self.examples_per_s:
            return None
        return max(self.total - self.examples, 0) / self.examples_per_s

    def metrics(self) -> str:
        if self.ended:
            return f"train AUC {self.ended['auc']:.4f} (all workers)"
        loss, auc = self.weighted("loss"), self.weighted("auc")
        return f"loss {loss:.4f} auc {auc:.4f}" if loss is not None and auc is not None else ""

    def line(self) -> str:
        """The plain form: one line of where the pass is."""
        total = self.examples if self.ended else self.total
        done = (f"{self.examples:,}/{total:,} examples ({self.examples / total:.0%})" if total
                else f"{self.examples:,} examples")
        eta = f", ETA {_duration(self.eta_s)}" if self.eta_s is not None else ""
        ended = f" in {self.ended['seconds']:.1f}s" if self.ended else ""
        return f"  epoch {self.epoch}: {done}{ended}, {self.examples_per_s:,.0f} ex/s{eta}, {self.metrics()}".rstrip(", ")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class _Bars:
    """The terminal form: a rich progress bar per pass, kept on screen when the pass ends."""

    def __init__(self, screen: TextIO):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self.progress = Progress(TextColumn("  epoch {task.fields[epoch]}"), BarColumn(bar_width=24),
                                 TextColumn("{task.fields[done]} examples  {task.fields[rate]}  {task.fields[eta]}  "
                                            "{task.fields[metrics]}"),
                                 console=Console(file=screen), redirect_stdout=False, redirect_stderr=False)
        self.tasks: dict[int, int] = {}

    def show(self, state: PassProgress) -> None:
        if not self.tasks:
            self.progress.start()
        if state.epoch not in self.tasks:
            self.tasks[state.epoch] = self.progress.add_task("", epoch=state.epoch, done="", rate="", eta="",
                                                             metrics="")
        total = state.examples if state.ended else state.total
        self.progress.update(self.tasks[state.epoch], completed=state.examples, total=total,
                             done=f"{state.examples:,}/{total:,}" if total else f"{state.examples:,}",
                             rate=f"{state.examples_per_s:,.0f} ex/s",
                             eta=f"ETA {_duration(state.eta_s)}" if state.eta_s is not None else "",
                             metrics=state.metrics())

    def say(self, text: str) -> bool:
        """Print above the bars while they are live; False when they are not."""
        if self.tasks and self.progress.live.is_started:
            self.progress.console.print(text, markup=False, highlight=False)
            return True
        return False

    def stop(self) -> None:
        if self.tasks:
            self.progress.stop()


class RunConsole:
    """Takes every line a local run prints (:class:`pipelines.local._ConsoleTap` hands them over)."""

    def __init__(self, screen: TextIO, log: TextIO, *, verbose: bool, period_s: float,
                 dataset_step: str, dataset_stats: Callable[[], Optional[dict]]):
        self.screen, self.log, self.verbose = screen, log, verbose
        self.period_s = max(period_s, PLAIN_LINE_PERIOD_S)
        # The step that writes the dataset, and its stats (rows per split) once written.
        self.dataset_step, self.dataset_stats = dataset_step, dataset_stats
        self.bars = _Bars(screen) if interactive(screen) and not verbose else None
        self.started: dict[str, float] = {}
        self.passes: dict[int, PassProgress] = {}
        self.last_plain = 0.0

    def take(self, line: str) -> None:
        plain = ANSI.sub("", line)
        # The train step passes the PS job's progress and pass events on as events (EventLog.structured): they
        # drive the bars, and the log keeps their readable line.
        tag, event = parse_event(plain) or (None, {})
        readable = {PROGRESS: format_progress, EPOCH: format_epoch}.get(tag)
        if readable is not None:
            plain = line = f"    {readable(event)}"
        self.log.write(plain + "\n")
        self.log.flush()
        if self.verbose:
            self.screen.write(line + "\n")
            self.screen.flush()
            return
        started, ended = _STEP_STARTED.search(plain), _STEP_ENDED.search(plain)
        if started:
            self.started[started["step"]] = time.monotonic()
        elif ended:
            self._step_ended(ended["step"], ended["status"])
        elif tag == PROGRESS and event.get("role") == "worker" and not event.get("state"):
            self._progress(event)
        elif tag == EPOCH:
            self._epoch(event)
        elif (shown := _SHOWN.match(plain)) is not None:
            self.say("  " + shown["line"])

    def say(self, text: str) -> None:
        if not (self.bars and self.bars.say(text)):
            self.screen.write(text + "\n")
            self.screen.flush()

    def step_cached(self, step: str) -> None:
        """kfp.local reused the step's outputs from its cache (it logs that; it prints nothing)."""
        self._step_ended(step, "SUCCESS", cached=True)

    def _step_ended(self, step: str, status: str, cached: bool = False) -> None:
        seconds = time.monotonic() - self.started.pop(step, time.monotonic())
        if step == "train" and self.bars:
            self.bars.stop()
        outcome = (f"{'cached':>7}" if cached else f"{seconds:6.1f}s" if status == "SUCCESS"
                   else f"{status} after {seconds:.1f}s")
        stats = self.dataset_stats() if step == self.dataset_step and status == "SUCCESS" else None
        rows = ("  " + ", ".join(f"{n:,} {SPLIT_NAMES.get(split, split)}" for split, n in stats["rows"].items())
                + " rows" if stats else "")
        self.say(f"  {step:<16}{outcome}{rows}")

    def _pass(self, epoch: int) -> PassProgress:
        if epoch not in self.passes:
            stats = self.dataset_stats()
            self.passes[epoch] = PassProgress(epoch, int(stats["rows"]["train"]) if stats else None)
        return self.passes[epoch]

    def _progress(self, event: dict) -> None:
        state = self._pass(event["epoch"])
        state.workers[event["index"]] = event
        if self.bars:
            self.bars.show(state)
        elif state.examples and time.monotonic() - self.last_plain >= self.period_s:
            self.last_plain = time.monotonic()
            self.say(state.line())

    def _epoch(self, event: dict) -> None:
        state = self._pass(event["epoch"])
        state.ended = event
        if self.bars:
            self.bars.show(state)
        else:
            self.say(state.line())

    def close(self) -> None:
        if self.bars:
            self.bars.stop()


def quiet_console_logging(verbose: bool) -> list[tuple[logging.Handler, int]]:
    """Keep the driver's INFO records (kfp.local's "Skipping task", "Cleaned up workspace") off the screen: they
    stay in the log file. Returns what to restore."""
    if verbose:
        return []
    changed = [(h, h.level) for h in logging.getLogger().handlers
               if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    for handler, _ in changed:
        handler.setLevel(max(handler.level, logging.WARNING))
    return changed


def read_stats(stats_path: Optional[Path]) -> Optional[dict]:
    return json.loads(stats_path.read_text()) if stats_path is not None and stats_path.is_file() else None
