"""Run the CTR pipeline on this machine with ``kfp.local`` (each step a subprocess of this Python).

After the run the run directory holds what a person looks at::

    run_dir/metrics.json  report.md  report.html  roc.png
    run_dir/logs/<role>-<i>.log         the PS processes' logs
    run_dir/checkpoint/                 (checkpoint.uri; the train step writes it there directly)
    run_dir/serving_model/              the exported serving model (python -m components.export.serving predict),
                                        unless the test AUC was under eval.min_auc
    run_dir/kfp/                        kfp.local's pipeline root: every artifact of every step

Console: ``kfp.local`` pipes a step's stdout+stderr and re-prints it line by line (indented) through
``print`` in this process. The steps run with ``PYTHONUNBUFFERED=1`` and the train step flushes each
progress line; :class:`_ConsoleTap` hands every whole line to :class:`pipelines.console.RunConsole`, which
writes it to the run's log file and shows the run's shape (steps, a progress bar per pass) as it happens, even
when stdout is a pipe. The tap also keeps the last lines, because a failed step only makes ``kfp.local``
raise "Inner task failed: <task>": :class:`PipelineRunError` carries the step's own error (for a PS job, the
failing role and its log tail) in its message.

Stopping: the driver owns the processes of its run (:class:`DriverSignals`). SIGTERM, SIGINT or SIGHUP stop
the running step (a train step tears its PS job down first) and the driver exits once every process it
started has, with status 128 + the signal. A driver killed outright (SIGKILL) is noticed by the train step,
which stops its job the same way (:func:`components.ps.liveness.stop_when_gone`, through ``$CTR_DRIVER_PID``).
"""

import builtins
import dataclasses
import glob
import io
import json
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any, Optional

from components.config import CtrConfig, ExportFormat
from components.config_rules import is_remote_uri
from components.ps.liveness import DRIVER_PID_ENV, process_exists
from pipelines.console import ANSI, RunConsole, header_lines, log_path, quiet_console_logging, read_stats
from pipelines.result import RunResult

# What the run directory gets from the evaluation directory (the Metrics artifact's path); also the training curve,
# when the job reported progress (components.evaluate.evaluate.CURVE_FILE).
REPORT_FILE = "report.html"  # the run's report (RunResult.report)
EVALUATION_FILES = ("metrics.json", "report.md", REPORT_FILE, "roc.png", "calibration.png")
TAP_LINES = 400
# How long a stopped run's processes get to end (a train step: TERM_GRACE_S for its PS job, then SIGKILL).
STOP_WAIT_S = 20.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_KFP_LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d+ - [A-Z]+ - ")
MERGE_STEP = "merge-data"  # the task whose output is the dataset (pipelines.pipeline.TASKS)
_TASK_OUTPUTS = re.compile(r" - INFO - Task '[\w-]+' outputs:$")
# conf/config.yaml's run directories: outputs/<date>/<time>-<token> (a run), multirun/<date>/<time>-<token>/<job> (a
# job of a sweep). The step cache sits above the date (outputs/.kfp-cache), so a run on another day finds it.
RUN_DATE = re.compile(r"\d{4}-\d\d-\d\d")
CACHE_DIR = ".kfp-cache"


class PipelineRunError(RuntimeError):
    """A step of a local pipeline run failed; the message ends with that step's own error."""

    def __init__(self, message: str, step_error: str = ""):
        found = re.search(r"Inner task failed: '?([\w-]+)", message)
        self.step = found.group(1) if found else None
        self.step_error = step_error
        super().__init__(message + (f"\n{step_error}" if step_error else ""))


class _ConsoleTap(io.TextIOBase):
    """Stands in for ``sys.stdout`` during a run: hands whole lines to the run's console, keeps a tail.

    It drops the executor-input JSON that kfp's executor logs at the start of every step (~125 lines of
    artifact plumbing) and the listing of each finished task's output artifacts (the ROC curve's points
    alone fill a screen); the run's kfp/ folder has both, and the tail keeps them for error reports.
    """

    def __init__(self, console: RunConsole):
        self.console = console
        self.lines: deque[str] = deque(maxlen=TAP_LINES)
        self._partial = ""
        self._json_indent: Optional[int] = None  # set while inside an executor-input dump
        self._in_outputs = False  # inside the listing of a task's output artifacts

    def write(self, text: str) -> int:
        *complete, self._partial = (self._partial + text).split("\n")
        for line in complete:
            self.lines.append(line)
            if self._shown(line):
                self.console.take(line)
        return len(text)

    def _shown(self, line: str) -> bool:
        stripped = line.strip()
        if self._in_outputs:  # a finished task's artifacts, up to kfp's separator line (which is shown)
            self._in_outputs = set(stripped) != {"-"}
            return not self._in_outputs
        if _TASK_OUTPUTS.search(ANSI.sub("", line)):
            self._in_outputs = True
            return False
        if self._json_indent is None:
            if line.rstrip().endswith("Got executor_input:"):
                self._json_indent = -1  # the next line opens the JSON object
                return False
            return True
        if self._json_indent == -1:
            self._json_indent = len(line) - len(line.lstrip())
        elif stripped == "}" and len(line) - len(line.lstrip()) == self._json_indent:
            self._json_indent = None
        return False

    def flush(self) -> None:
        self.console.screen.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.console.screen, "isatty", lambda: False)())

    def step_error(self) -> str:
        return step_error(list(self.lines) + ([self._partial] if self._partial else []))


def step_error(lines: list[str]) -> str:
    """The exception a step's Python process died with, taken from its re-printed output.

    The step's last ``Traceback`` wins; the frames are dropped, the exception line and its continuation lines
    (a PsJobError's log tail) are kept, up to kfp's own log lines. Without a traceback: the last lines.
    """
    lines = [ANSI.sub("", line) for line in lines]
    starts = {i: len(line) - len(line.lstrip()) for i, line in enumerate(lines)
              if line.strip() == "Traceback (most recent call last):"}
    if not starts:
        tail = [line for line in lines if line.strip() and not _KFP_LOG_LINE.match(line)]
        return "\n".join(tail[-20:])
    # A traceback quoted inside the error (a role's log tail) is indented deeper than the step's own.
    indent = min(starts.values())
    start = max(i for i, depth in starts.items() if depth == indent)
    out: list[str] = []
    for line in lines[start + 1:]:
        if _KFP_LOG_LINE.match(line) or set(line.strip()) == {"-"}:
            break
        if not out and (not line.strip() or len(line) - len(line.lstrip()) > indent):
            continue  # a frame of the traceback
        out.append(line[indent:] if line[:indent].isspace() else line)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), from ``/proc/<pid>/task/*/children``."""
    found, frontier = [], [pid]
    while frontier:
        for path in glob.glob(f"/proc/{frontier.pop()}/task/*/children"):
            try:
                children = [int(child) for child in Path(path).read_text().split()]
            except OSError:  # exited meanwhile
                continue
            found += children
            frontier += children
    return found


class DriverSignals:
    """While a local run executes (main thread only): SIGTERM, SIGINT and SIGHUP stop it in order.

    The handler sends SIGTERM to the driver's descendants in its own process group (the kfp.local step and
    the ``sh`` it runs under; PS processes run in sessions of their own and are the step's to stop), waits up to
    :data:`STOP_WAIT_S` until no process the driver had started is left, then exits with 128 + the signal.
    The steps learn the driver's pid from ``$CTR_DRIVER_PID``, set for the run's duration.
    """

    def __enter__(self) -> "DriverSignals":
        self._env = os.environ.get(DRIVER_PID_ENV)
        os.environ[DRIVER_PID_ENV] = str(os.getpid())
        self._previous = ({sig: signal.signal(sig, self._stop) for sig in STOP_SIGNALS}
                          if threading.current_thread() is threading.main_thread() else {})
        return self

    def _stop(self, signum: int, frame: Any) -> None:
        for sig in STOP_SIGNALS:  # a second signal must not cut the wait short
            signal.signal(sig, signal.SIG_IGN)
        started = descendants(os.getpid())
        group = os.getpgrp()
        for pid in started:
            try:
                if os.getpgid(pid) == group:
                    os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + STOP_WAIT_S
        while any(process_exists(pid) for pid in started) and time.time() < deadline:
            time.sleep(0.1)
        left = [pid for pid in started if process_exists(pid)]
        name = signal.Signals(signum).name
        print(f"error: stopped by {name}: " + (f"processes {left} did not end within {STOP_WAIT_S:.0f}s" if left
                                               else "the running step and its processes have ended"),
              file=sys.__stderr__, flush=True)
        raise SystemExit(128 + signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        if self._env is None:
            os.environ.pop(DRIVER_PID_ENV, None)
        else:
            os.environ[DRIVER_PID_ENV] = self._env


def local_config(cfg: CtrConfig) -> CtrConfig:
    """Absolute paths for a local run: ``run_dir``, a local ``checkpoint.uri`` (relative = under run_dir) and the
    step cache's ``cluster.local_cache_root`` (:func:`local_cache_root`; the days of a daily run share it).

    Remote stores (``s3://...``, ``hdfs://...``) pass through unchanged.
    """
    run_dir = Path(cfg.run_dir).expanduser().resolve()
    uri = cfg.checkpoint.uri
    if not is_remote_uri(uri):
        checkpoint = Path(uri.removeprefix("file://")).expanduser()
        uri = str((checkpoint if checkpoint.is_absolute() else run_dir / checkpoint).resolve())
    cluster = dataclasses.replace(cfg.cluster, local_cache_root=str(local_cache_root(cfg.cluster.local_cache_root,
                                                                                     run_dir)))
    return dataclasses.replace(cfg, run_dir=str(run_dir), checkpoint=dataclasses.replace(cfg.checkpoint, uri=uri),
                               cluster=cluster)


def local_cache_root(configured: Optional[str], run_dir: Path) -> Path:
    """Where kfp.local keeps its step cache: ``configured`` (``cluster.local_cache_root``), else ``.kfp-cache`` in
    the directory above the run's date (``outputs/.kfp-cache``; a sweep's jobs: ``multirun/.kfp-cache``), which the
    runs of every day share; for a run directory outside that layout, beside it."""
    if configured:
        return Path(configured).expanduser().resolve()
    for dated in (run_dir.parent, run_dir.parent.parent):
        if RUN_DATE.fullmatch(dated.name):
            return dated.parent / CACHE_DIR
    return run_dir.parent / CACHE_DIR


def run_pipeline_locally(cfg: CtrConfig) -> RunResult:
    """Execute :func:`pipelines.pipeline.ctr_pipeline` with kfp.local on ``cfg``, a local run's config
    (:func:`local_config`, made once by :func:`pipelines.ctr.run`); returns the test metrics, the report and the
    checkpoint the train step delivered.

    Raises :class:`PipelineRunError` naming the failed step and quoting its error.
    """
    from kfp import local

    from components.resolve.step import run_parameters
    from pipelines.pipeline import PIPELINE_NAME, ctr_pipeline

    run_dir = Path(cfg.run_dir)
    pipeline_root = run_dir / "kfp"
    workspace = pipeline_root / "workspace"  # must exist; kfp.local deletes it after the run
    workspace.mkdir(parents=True, exist_ok=True)
    cache_root = Path(cfg.cluster.local_cache_root)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root),
               workspace_root=str(workspace), enable_caching=cfg.cluster.local_cache, cache_root=str(cache_root))
    started = time.time()
    stdout, print_function = sys.stdout, builtins.print
    with open(log_path(run_dir), "a") as log:
        cache = CacheHits(cache_root)
        console = RunConsole(stdout, log, verbose=cfg.verbose, period_s=cfg.ps.progress_period_s,
                             dataset_step=MERGE_STEP,
                             dataset_stats=lambda: read_stats(_merged_stats(pipeline_root) or cache.dataset_stats()))
        cache.console = console
        console.say("\n".join(header_lines(cfg)))
        root_logger = logging.getLogger()
        root_level = root_logger.level
        # kfp.local logs its cache hits at INFO on the root logger, which importing Paddle sets to WARNING.
        root_logger.setLevel(min(root_level or logging.WARNING, logging.INFO))
        root_logger.addHandler(cache)
        tap = _ConsoleTap(console)
        sys.stdout = tap
        quieted = quiet_console_logging(cfg.verbose)
        try:
            with warnings.catch_warnings(), DriverSignals():
                # The subprocess runner warns about any image name without "python" in it.
                warnings.filterwarnings("ignore", message=".*non-Python base image.*", category=RuntimeWarning)
                ctr_pipeline(cfg)(**run_parameters(cfg))
        except RuntimeError as err:
            raise PipelineRunError(ANSI.sub("", str(err)), tap.step_error()) from None
        finally:
            root_logger.removeHandler(cache)
            root_logger.setLevel(root_level)
            console.close()
            sys.stdout = stdout
            # kfp.local indents a task's output by swapping builtins.print while the task runs; once in the suite the
            # swap outlived the run (a later plan printed indented), so the run's own print comes back regardless.
            builtins.print = print_function
            for handler, level in quieted:
                handler.setLevel(level)
            if tap._partial:
                console.take(tap._partial)
    wall_s = time.time() - started
    # Read from where kfp.local keeps every task's outputs, <pipeline root>/<pipeline>-<time>/<task>/<output>: the
    # export may be skipped (the AUC gate), and a daily pipeline has no pipeline outputs (its steps sit in a
    # condition).
    runs = sorted(pipeline_root.glob(f"{PIPELINE_NAME}-*"))
    if not runs or not (runs[-1] / "evaluate-model" / "metrics").is_dir():
        raise PipelineRunError(f"the pipeline run in {pipeline_root} evaluated no model (was its day trained "
                               "already?)")
    outputs = runs[-1]
    exported = outputs / "export-model" / "serving_model"
    metrics = collect_outputs(run_dir, metrics_dir=str(outputs / "evaluate-model" / "metrics"),
                              logs_dir=str(outputs / "train" / "logs"),
                              serving_dir=exported if exported.is_dir() else None)
    serving = (str(run_dir / "serving_model") if exported.is_dir() else
               f"not exported: test AUC {metrics['auc']:.4f} < eval.min_auc {cfg.eval.min_auc:g}")
    training = json.loads((outputs / "train" / "checkpoint").read_text())
    print_summary(metrics, training, wall_s, run_dir, cfg.checkpoint.uri, serving,
                  serving_rows(cfg, run_dir) if exported.is_dir() else [])
    return RunResult(metrics=metrics, run_dir=run_dir, report=run_dir / REPORT_FILE, checkpoint=training["id"])


class CacheHits(logging.Handler):
    """kfp.local's cache hits, which it logs (and does not print): the console's step line says ``cached``, and a
    cached merge's dataset, in the run that made it, is found from the cache entry the hit names."""

    _HIT = re.compile(r"^Task (?P<step>[\w-]+) cache hit \(key=(?P<key>[0-9a-f]+)\)")

    def __init__(self, cache_root: Path):
        super().__init__(logging.INFO)
        self.cache_root = cache_root
        self.console: Optional[RunConsole] = None
        self.outputs: dict[str, dict] = {}  # step -> its cached outputs (kfp.local's entry)

    def emit(self, record: logging.LogRecord) -> None:
        hit = self._HIT.match(record.getMessage())
        if hit is None:
            return
        entry = next(self.cache_root.glob(f"{hit['key']}*.json"), None)
        self.outputs[hit["step"]] = json.loads(entry.read_text()) if entry else {}
        if self.console is not None:
            self.console.step_cached(hit["step"])

    def dataset_stats(self) -> Optional[Path]:
        uri = self.outputs.get(MERGE_STEP, {}).get("dataset", {}).get("uri")
        return Path(uri) / "stats.json" if uri else None


def _merged_stats(pipeline_root: Path) -> Optional[Path]:
    """The dataset's stats.json once the merge step wrote it (kfp.local: <root>/<pipeline>-<time>/<task>/<output>)."""
    from pipelines.pipeline import PIPELINE_NAME

    found = sorted(pipeline_root.glob(f"{PIPELINE_NAME}-*/{MERGE_STEP}/*/stats.json"))
    return found[-1] if found else None


def collect_outputs(run_dir: Path, metrics_dir: str, logs_dir: str, serving_dir: Optional[str | Path] = None) -> dict:
    """Copy the evaluation files, the PS logs and the serving model (None: not exported) out of the artifact
    store into the run directory (``run_dir/serving_model/`` is replaced as a whole, or removed)."""
    target = run_dir / "serving_model"
    shutil.rmtree(target, ignore_errors=True)
    if serving_dir is not None:
        shutil.copytree(serving_dir, target)
    for name in EVALUATION_FILES:
        shutil.copyfile(Path(metrics_dir) / name, run_dir / name)
    from components.evaluate.evaluate import CURVE_FILE

    from components.evaluate.days import DAYS_CSV, DAYS_PNG

    for name in (CURVE_FILE, DAYS_CSV, DAYS_PNG):  # written when the job reported progress / trained a day
        if (Path(metrics_dir) / name).is_file():
            shutil.copyfile(Path(metrics_dir) / name, run_dir / name)
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    for log in sorted(Path(logs_dir).glob("*.log")):
        shutil.copyfile(log, logs / log.name)
    return json.loads((run_dir / "metrics.json").read_text())


def summary_rows(metrics: dict, training: Optional[dict], wall_s: float) -> list[tuple[str, str]]:
    rows = [("test AUC", f"{metrics['auc']:.4f}"), ("test logloss", f"{metrics['logloss']:.4f}")]
    before = metrics.get("uncalibrated_calibration")
    rows.append(("calibration", f"{metrics['calibration']:.4f}" + (f" ({before:.4f} before the post-hoc calibration)"
                                                                    if before is not None else "")))
    if metrics.get("baseline_auc") is not None:  # whether the model earns its cost, at a glance
        rows.append(("LR baseline AUC", f"{metrics['baseline_auc']:.4f} (the model's lift {metrics['lift_auc']:+.4f})"))
    if metrics.get("auc_ratio_to_bayes") is not None:
        rows.append(("AUC / Bayes AUC", f"{metrics['auc_ratio_to_bayes']:.2%} (Bayes {metrics['bayes_auc']:.4f})"))
    if training and training.get("seconds") is not None:
        rows.append(("training", f"{training['seconds']:.1f}s, {training.get('examples_per_s') or 0:,.0f} examples/s"))
    rows.append(("wall time", f"{wall_s:.1f}s"))
    return rows


def serving_rows(cfg: CtrConfig, run_dir: Path) -> list[tuple[str, str]]:
    """After an export, the summary's exact command that serves it (the export store, which the server follows, so
    later runs' exports reach a running server; a single-file export: its copy in the run directory) and a request
    to try it with."""
    from components.export.serve_command import example_request, serve_command
    from components.export.store import export_store_uri

    model = str(run_dir / "serving_model") if cfg.export.format is ExportFormat.single else export_store_uri(cfg)
    name = cfg.cluster.serving.name
    return [("serve it", shlex.join(serve_command(model, name))), ("then try", example_request(name))]


def print_summary(metrics: dict, training: Optional[dict], wall_s: float, run_dir: Path, checkpoint: Any,
                  serving: str, serve: list[tuple[str, str]] = ()) -> None:
    """The summary table; ``serve``: the rows of :func:`serving_rows` after an export."""
    rows = [*summary_rows(metrics, training, wall_s), ("run dir", str(run_dir)), ("checkpoint", str(checkpoint)),
            ("serving model", serving), *serve]
    width = max(len(name) for name, _ in rows)
    print("\n".join(["", "== CTR pipeline done", *(f"  {name:<{width}}  {value}" for name, value in rows), ""]),
          flush=True)
