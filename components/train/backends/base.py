"""The one interface of the backends: how a prepared PS job is run, whatever runs it.

:meth:`JobBackend.run` is the template every backend follows: :meth:`~JobBackend.prepare` what the job needs
before anything starts, announce the job, then, with the launcher's stop signals turned into an exception,
:meth:`~JobBackend.start` the job and :meth:`~JobBackend.follow` it to its end, and always
:meth:`~JobBackend.stop` it: nothing the backend started outlives ``run()``, whether the job succeeded, failed
or was cancelled. A failure is raised from ``follow`` as a :class:`~components.train.job.PsJobError` that names
the role that failed first and quotes its log; how it is found is each backend's own (a process's exit code and
output pipe, a pod's status and log).

The train step builds a backend with :meth:`JobBackend.for_step` from :class:`StepInputs`, so that it needs no
knowledge of what each backend reads of them.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Optional, Protocol

from components.checkpoint.lease import StoreLease
from components.ps.liveness import DRIVER_PID_ENV
from components.train.job import EventLog, JobResult, PreparedJob


class StopGuard(Protocol):
    """While entered, the launcher's stop signals (SIGTERM: Kubeflow cancelling the step) raise in ``run()``;
    after :meth:`hold`, the teardown has begun and is not cut short by another one."""

    def hold(self) -> None: ...


@dataclass(frozen=True)
class StepInputs:
    """What the train step has for any backend; each reads what it needs."""

    data_dir: Path  # the prepared dataset on this machine: local processes read it
    data_uri: Optional[str]  # where the dataset is stored remotely: pods fetch their shards from it
    log_dir: Path  # the step's logs artifact: one log per role
    echo: Callable[[str], None]
    lease: Optional[StoreLease]  # the checkpoint store's lease the step holds for the job


class JobBackend(ABC):
    """One PS job run by one backend, from preparing it to stopping what it started."""

    def __init__(self, job: PreparedJob, log_dir: Path, echo: Callable[[str], None]):
        self.job, self.cfg, self.echo = job, job.cfg, echo
        self.log_dir = Path(log_dir)
        # A step of the local driver: its console takes the events themselves (components.ps.liveness.DRIVER_PID_ENV).
        self.events = EventLog(echo, structured=DRIVER_PID_ENV in os.environ)

    @classmethod
    @abstractmethod
    def for_step(cls, job: PreparedJob, inputs: StepInputs) -> "JobBackend":
        """The backend the train step runs ``job`` with."""

    @property
    @abstractmethod
    def name(self) -> str:
        """The job's name in every line the launcher prints about it."""

    @abstractmethod
    def prepare(self) -> None:
        """What must exist before anything starts (directories, ports, the log follower); starts nothing."""

    @abstractmethod
    def where(self) -> str:
        """Where the job runs and reads its data, for the announcement (``logs in ...``, ``data ...``)."""

    @abstractmethod
    def stop_guard(self) -> ContextManager[StopGuard]:
        """The launcher's stop signals as an exception in ``run()`` while the job runs."""

    @abstractmethod
    def start(self) -> None:
        """Start the job's roles (processes, or the Kubernetes objects that make pods)."""

    @abstractmethod
    def follow(self) -> None:
        """Return when the job succeeded; raise :class:`~components.train.job.PsJobError`, naming the role
        that failed first, when it failed."""

    @abstractmethod
    def stop(self) -> None:
        """Stop and remove whatever was started, whatever state it is in; reports, never raises, what it
        cannot remove."""

    def run(self) -> JobResult:
        self.prepare()
        started = time.time()
        self.echo(f"PS job {self.name}: {self.cfg.ps.servers} server(s) + {self.cfg.ps.workers} worker(s), "
                  f"mode {self.cfg.ps.mode.value}, {self.where()}")
        for line in self.job.lines():
            self.echo(line)
        with self.stop_guard() as guard:
            try:
                self.start()
                self.follow()
            except KeyboardInterrupt:
                self.echo(f"interrupted: stopping PS job {self.name}")
                raise
            finally:
                guard.hold()
                self.stop()
        return self.result(time.time() - started)

    def result(self, seconds: float) -> JobResult:
        """What the job's events told (worker 0's, on Kubernetes: the log the launcher follows)."""
        return JobResult(epochs=self.events.epochs, seconds=seconds, checkpoints=self.events.checkpoints,
                         restored_from=self.job.restore, plan=self.job.plan.memory, curve=self.events.curve,
                         day_eval=self.events.day_eval)
