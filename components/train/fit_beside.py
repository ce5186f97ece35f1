"""The baseline fitted beside a local job: kfp.local runs one task at a time, so its train step fits it itself.

A model that blends the baseline in (``model.blend_baseline``) needs it only when its workers first judge a
checkpoint. On Kubeflow the fit-baseline step runs beside the train step; kfp.local would run it first, and the run
would wait for the fit (17 s of a 74 s run on 800k rows here) before training starts. So on kfp.local the train
step starts the fit as a process of its own beside its job's (``python -m components.evaluate.baseline_step``),
which publishes it under the step cache's root where the workers wait for it
(:mod:`components.networks.baseline_handoff`); the fit-baseline step after it takes the published fit. A fit
published there already (a sweep's other jobs, a rerun on the same prepared data) is not fitted again.

The fit's process dies with the train step; a fit that ends without publishing anything (killed, out of memory)
is published as failed on its behalf, so that the workers end with its error instead of waiting for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

from components.networks.baseline_handoff import FAILED_FILE, is_published, publish_failure
from components.ps.liveness import PARENT_PID_ENV, signal_group
from components.storage import Storage

LOG_FILE = "baseline.log"  # beside the roles' logs
STOP_GRACE_S = 10.0


@contextlib.contextmanager
def fitting_beside(data_dir: Path, rows: int, features: int, handoff: str, work_dir: Path, log_dir: Path,
                   echo: Callable[[str], None]) -> Iterator[None]:
    """While the body runs (the job), the baseline of ``data_dir`` is fitted beside it and published at
    ``handoff``, unless a fit is published there already; the fit's process is stopped when the body ends."""
    store = Storage(handoff)
    if is_published(store):
        echo(f"== baseline for the blend: fitted already, published at {store.display_uri}")
        yield
        return
    log_path = Path(log_dir) / LOG_FILE
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        popen = subprocess.Popen(
            [sys.executable, "-m", "components.evaluate.baseline_step", str(data_dir), str(rows), str(features),
             str(work_dir), handoff],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", PARENT_PID_ENV: str(os.getpid())})
    echo(f"== baseline for the blend: fitting beside the job on {rows:,} rows at most (log: {log_path})")
    stopped = threading.Event()  # by this step, whose job ended: not a failure of the fit
    watcher = threading.Thread(target=_watch, args=(popen, store, log_path, started, stopped, echo), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        if popen.poll() is None:
            stopped.set()
            signal_group(popen, signal.SIGTERM)
            try:
                popen.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                signal_group(popen, signal.SIGKILL)
                popen.wait()
        watcher.join()


def _watch(popen: subprocess.Popen, store: Storage, log_path: Path, started: float, stopped: threading.Event,
           echo: Callable[[str], None]) -> None:
    """Say how the fit ended; publish its failure for it when it ended without a word (killed, out of memory) and
    not because this step stopped it."""
    code = popen.wait()
    if code == 0:
        echo(f"== baseline for the blend: fitted beside the job in {time.monotonic() - started:.1f}s")
        return
    if stopped.is_set() or is_published(store) or store.read_json(None, FAILED_FILE) is not None:
        return
    with open(log_path, errors="replace") as log:
        last = next((line.strip() for line in reversed(deque(log, maxlen=20)) if line.strip()), "")
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    publish_failure(store, f"the fit {how} ({last or 'no output'}); its log: {log_path}")
