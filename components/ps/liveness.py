"""A PS process's lifetime: it dies with whoever started it, and it shows, while it lives, that it is not stuck.

* :func:`die_with_parent`: the kernel kills the process when its parent exits (Linux ``PR_SET_PDEATHSIG``),
  so a launcher killed outright (SIGKILL, OOM) takes its servers, workers and their helpers with it.
  :func:`children_die_with_this_process` does the same for the processes Paddle forks with
  ``multiprocessing`` (its gloo rendezvous store, a ``Manager``); :func:`stop_when_gone` for a launcher whose
  owner is not its parent (a kfp.local step under the local pipeline driver).
* :class:`Heartbeat`: a thread that reports every ``ps.progress_period_s``: a worker's progress during a pass,
  otherwise a :data:`~components.ps.contract.HEARTBEAT` event. A server's thread would never run
  (``run_server()`` holds the GIL), so its sidecar (:mod:`components.ps.shard_uploader`) reports for it, each time
  after the server's brpc service answered (``/health`` on its PS port). A worker that waits in a collective
  (barrier, all-reduce: Paddle holds the GIL there too, so the thread is silent) says so first
  (:meth:`Heartbeat.waiting`), and the launcher does not count its silence as a stall while another worker is
  still working.
* :class:`HeartbeatRecord`: each beat is also written, as a small object, into the checkpoint store
  (``_liveness/<role>-<index>.json``: :func:`record_rel`), the one place every backend shares (a pod has no API
  token; its log is read for worker 0 only). The launchers judge liveness from these records, the same way on
  every backend, under one stall rule (:mod:`components.train.liveness`); the stdout events stay for the progress
  shown. The store holds one job at a time (its lease), so its ``_liveness`` folder is the job's.
"""

from __future__ import annotations

import ctypes
import multiprocessing.util
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from components.checkpoint.store import CheckpointStore, CheckpointStoreError
from components.ps.contract import HEARTBEAT, PROGRESS, emit

PARENT_PID_ENV = "PS_PARENT_PID"  # set by a launcher whose children must not outlive it
# Set by a local pipeline driver (pipelines.local) for its kfp.local step processes: a train step stops its PS
# job when the driver dies.
DRIVER_PID_ENV = "CTR_DRIVER_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: Optional[int], sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent exits; exit now if the parent (pid
    ``expected_parent``) has already gone. Does nothing when ``expected_parent`` is None or off Linux."""
    if expected_parent is None:
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return
    if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return
    if os.getppid() != expected_parent:  # the parent died before the guard was set: nobody will signal us
        os.kill(os.getpid(), sig)


def signal_group(popen: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group ``popen`` leads (started with ``start_new_session``); nothing if it has
    gone already."""
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def parent_from_env() -> Optional[int]:
    value = os.environ.get(PARENT_PID_ENV)
    return int(value) if value else None


def driver_from_env() -> Optional[int]:
    """The local pipeline driver this process is a step of (:data:`DRIVER_PID_ENV`), unless it is that driver."""
    value = os.environ.get(DRIVER_PID_ENV)
    return int(value) if value and int(value) != os.getpid() else None


def process_state(pid: int) -> Optional[str]:
    """The state letter of ``/proc/<pid>/stat`` (R running, S sleeping, T stopped, Z exited, ...); None if none."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def process_exists(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, which has exited and awaits its parent, does not count)."""
    return process_state(pid) not in (None, "Z")


def stop_when_gone(pid: Optional[int], sig: int = signal.SIGTERM, poll_s: float = 0.5) -> None:
    """Send ``sig`` to this process once process ``pid`` has exited, from a daemon thread that polls it.

    For an ancestor that is not this process's parent (a kfp.local step runs under ``sh``, the driver's child),
    whose death :func:`die_with_parent` cannot report. Does nothing when ``pid`` is None.
    """
    if pid is None:
        return

    def watch() -> None:
        while process_exists(pid):
            time.sleep(poll_s)
        os.kill(os.getpid(), sig)

    threading.Thread(target=watch, name=f"watch-{pid}", daemon=True).start()


class _Guard:
    """What multiprocessing's after-fork registry holds (weakly): one per process, kept for its lifetime."""


_GUARD = _Guard()


def children_die_with_this_process() -> None:
    """Every process this one forks with ``multiprocessing`` gets :func:`die_with_parent`."""
    parent = os.getpid()
    multiprocessing.util.register_after_fork(_GUARD, lambda _guard: die_with_parent(parent))


def brpc_answers(endpoint: str, timeout_s: float, context: Optional[ssl.SSLContext] = None) -> bool:
    """True when the brpc server at ``host:port`` answers its built-in ``/health`` page (over TLS with
    ``context``: :func:`components.ps.brpc_tls.client_context`)."""
    url = f"{'https' if context else 'http'}://{endpoint}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as reply:
            return reply.status == 200
    except OSError:
        return False


# A worker samples its progress this often for the training curve (:data:`CURVE_KEY` of its next progress event), so
# that a pass of a few seconds still draws a curve; the events themselves keep to ps.progress_period_s.
CURVE_SAMPLE_S = 0.5
CURVE_KEY = "curve"  # a progress event's samples since the last event: [[examples, loss, auc], ...]

LIVENESS = "_liveness"  # the store's folder of the roles' heartbeat records
# Tries per record write: a beat that cannot be written is skipped, the next one tries again (a heartbeat thread
# that retried for long would itself look stalled).
RECORD_TRIES = 2


def record_rel(role: str, index: int) -> str:
    return f"{LIVENESS}/{role}-{index}.json"


def clear_heartbeats(store: CheckpointStore) -> None:
    """Remove the heartbeat records an earlier job (or attempt) left: only its lease's holder may, before its
    roles start."""
    for name in store.list_control(LIVENESS):
        store.remove(f"{LIVENESS}/{name}")


class HeartbeatRecord:
    """One role's heartbeat record in the store: ``{role, index, job, seq, time, waiting, work, epoch, examples,
    done}``. ``seq`` grows with every write, so a reader tells a fresh beat from an old one on its own clock (hosts'
    clocks differ); ``job`` is the job the role belongs to (``SYS_JOB_ID``: a restarted Kubernetes job has a new
    name, so its old pods' last beats are told apart); ``work``: a server's save or upload that advanced."""

    def __init__(self, store: CheckpointStore, role: str, index: int, job: str):
        self.store, self.role, self.index, self.job = store, role, index, job
        self.seq = 0
        self._lock = threading.Lock()  # the beat thread and a server's upload loop both write

    @classmethod
    def from_env(cls, uri: str, role: str, index: int) -> "HeartbeatRecord":
        return cls(CheckpointStore(uri, retries=RECORD_TRIES), role, index, os.environ.get("SYS_JOB_ID", ""))

    def write(self, waiting: bool = False, progress: Optional[dict] = None, work: Optional[str] = None,
              done: bool = False) -> None:
        with self._lock:
            self.seq += 1
            record = {"role": self.role, "index": self.index, "job": self.job, "seq": self.seq, "time": time.time(),
                      "waiting": waiting, "work": work, "done": done,
                      "epoch": (progress or {}).get("epoch"), "examples": (progress or {}).get("examples")}
            try:
                self.store.write_json(None, record_rel(self.role, self.index), record)
            except CheckpointStoreError as err:  # the launcher sees the store's trouble through its lease
                print(f"warning: {self.role} {self.index}: heartbeat not recorded: {err}", file=sys.stderr,
                      flush=True)


class Heartbeat:
    """Reports this process alive every ``period_s`` from a daemon thread.

    ``progress()``: the progress event's payload to report instead of a heartbeat (a worker in a pass), or
    None; sampled every :data:`CURVE_SAMPLE_S` in between, the samples ride in the event (:data:`CURVE_KEY`).
    ``healthy()``: False skips a beat (a server whose brpc service does not answer). ``publish(payload)``: also
    given each progress payload (worker 0 on a Kubeflow Trainer pod: :mod:`components.ps.trainer_status`).
    ``record``: where each beat is also written in the store (None: stdout only).
    """

    def __init__(self, role: str, index: int, period_s: float,
                 progress: Optional[Callable[[], Optional[dict]]] = None,
                 healthy: Optional[Callable[[], bool]] = None,
                 publish: Optional[Callable[[dict], None]] = None,
                 record: Optional[HeartbeatRecord] = None):
        self.role, self.index, self.period_s = role, index, period_s
        self.progress, self.healthy, self.publish, self.record = progress, healthy, publish, record
        self._waiting = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{role}-{index}", daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def beat(self) -> None:
        emit(HEARTBEAT, role=self.role, index=self.index, waiting=self._waiting > 0)
        if self.record is not None:
            self.record.write(waiting=self._waiting > 0)

    def done(self) -> None:
        """The role's part of the job is done (after :meth:`stop`): the last record says so."""
        if self.record is not None:
            self.record.write(done=True)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Around a call that waits for the other workers: announced before it starts, and after it ends."""
        self._waiting += 1
        self.beat()
        try:
            yield
        finally:
            self._waiting -= 1
            self.beat()

    def _run(self) -> None:
        tick = min(CURVE_SAMPLE_S, self.period_s) if self.progress is not None else self.period_s
        samples: list[list] = []
        next_report = time.monotonic() + self.period_s
        while not self._stop.wait(tick):
            payload = self.progress() if self.progress is not None and not self._waiting else None
            if payload is not None and payload.get("loss") is not None:
                samples.append([payload["examples"], payload["loss"], payload["auc"]])
            if time.monotonic() < next_report:
                continue
            next_report = time.monotonic() + self.period_s
            if self.healthy is not None and not self.healthy():
                continue
            if payload is not None:
                emit(PROGRESS, **payload, **({CURVE_KEY: samples} if samples else {}))
                if self.publish is not None:
                    self.publish(payload)
                if self.record is not None:
                    self.record.write(progress=payload)
            else:
                self.beat()
            samples = []
