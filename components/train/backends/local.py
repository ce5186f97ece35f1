"""Runs a PS job: the ``local`` backend starts servers and workers as supervised local processes.

Each process gets exactly the environment a Kubernetes pod would (:func:`env.role_env`). The launcher
streams every process's output into ``logs/<role>-<i>.log``, prints the workers' progress, and owns
shutdown: when all workers finish it waits for the servers to stop; when any process dies, reports nothing
for ``ps.stall_timeout_s`` (stopped, hung: its heartbeat record in the store stops changing,
:mod:`components.train.liveness`), or the job loses its checkpoint store's lease, it stops the
whole job within seconds and raises :class:`PsJobError` naming the role (or the store) and its last log
lines. SIGTERM, SIGINT and SIGHUP stop it the same way (:class:`JobStopped`).

A role that dies or stalls does not end the job at once: the launcher stops every process of the attempt and
starts the whole job again from the newest intact checkpoint the run committed, up to ``cluster.max_restarts``
times, one console line each saying what failed and what it costs (:mod:`components.train.restarts`). A role that
exits with a configuration error, a job that cannot start at all, and a lost lease fail the job at once.

No process of the job outlives :meth:`LocalJob.run`, nor the launcher itself: each process dies with it
(:func:`components.ps.liveness.die_with_parent`), even when the launcher is killed outright.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from components.checkpoint.lease import StoreLease
from components.checkpoint.restore import restart_target
from components.checkpoint.store import CheckpointStoreError
from components.ps.contract import (HEARTBEAT, STORE_REFUSED_EXIT, STORE_REFUSED_PREFIX, ClusterLayout, Role,
                                    endpoint_accepts, role_env)
from components.ps.liveness import PARENT_PID_ENV, process_state, signal_group
from components.train.backends.base import JobBackend, StepInputs
from components.train.job import (JobResult, PreparedJob, PsJobError, PsJobStoreError, RoleFailed, StopSignals,
                                  check_lease, clean_store)
from components.train.liveness import Liveness, stall_what
from components.train.restarts import NOT_RESTARTED, Attempt, Restart, position

TAIL_LINES = 30
POLL_S = 0.2
# Paddle's SIGTERM handler prints its error summary and exits within ~0.3 s (measured); a process still there
# after this long is killed.
TERM_GRACE_S = 3.0
# Once the job is ending, every process gets this long to exit before it is reported and killed.
SERVER_EXIT_S = 30.0


class JobStopped(PsJobError):
    """The launcher was asked to stop (SIGTERM, SIGINT, SIGHUP); the job's processes are stopped."""


@dataclass
class Process:
    role: Role
    index: int
    popen: subprocess.Popen
    log_path: Path
    attempt: Attempt
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    started: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return f"{self.role.value}-{self.index}"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the OS reports free right now; held open together so they are distinct."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def local_layout(servers: int, workers: int, host: str, job_id: str) -> ClusterLayout:
    """A layout on one host with fresh ports, so concurrent jobs (sweeps, tests) never collide."""
    ports = free_ports(servers + workers + 1, host)
    return ClusterLayout(
        server_endpoints=tuple(f"{host}:{port}" for port in ports[:servers]),
        worker_endpoints=tuple(f"{host}:{port}" for port in ports[servers:servers + workers]),
        gloo_endpoint=f"{host}:{ports[-1]}",
        job_id=job_id,
    )


class LocalJob(JobBackend):
    """A prepared job (:func:`components.train.job.prepare_job`) on ``data_dir`` as processes of this machine;
    checkpoints go to ``checkpoint.uri``, whose ``lease`` (if given) the job fails without."""

    def __init__(self, job: PreparedJob, data_dir: Path, log_dir: Path, echo: Callable[[str], None] = print,
                 lease: Optional[StoreLease] = None):
        super().__init__(job, log_dir, echo)
        self.lease = lease
        self.job_id = job.run_id
        self.work_root = self.log_dir / "work"
        self.data_dir = str(Path(data_dir).resolve())
        self.layout: Optional[ClusterLayout] = None
        self.processes: list[Process] = []
        self.server_memory: dict[int, dict] = {}  # server index -> {"serving_rss", "peak_rss"} in bytes
        # What the current attempt starts from (a restart resumes this run's newest intact checkpoint), and counts.
        self.attempt_job, self.attempt = job, Attempt(1)
        self.attempts = self.cfg.cluster.max_restarts + 1
        self.restarts: list[Restart] = []
        self.pumps: list[threading.Thread] = []
        ps = self.cfg.ps
        self.liveness = Liveness(job.store, self.job_id, ps.stall_timeout_s, ps.startup_timeout_s + ps.stall_timeout_s)

    @classmethod
    def for_step(cls, job: PreparedJob, inputs: StepInputs) -> "LocalJob":
        return cls(job, inputs.data_dir, inputs.log_dir, echo=inputs.echo, lease=inputs.lease)

    @property
    def name(self) -> str:
        return self.job_id

    @property
    def progress(self) -> dict[str, dict]:
        return self.events.progress

    @property
    def checkpoints(self) -> list[dict]:
        """Committed so far: readable while the job runs, and after it failed."""
        return self.events.checkpoints

    def _spawn(self, role: Role, index: int) -> Process:
        workdir = self.work_root / f"{role.value}-{index}"
        workdir.mkdir(parents=True, exist_ok=True)
        spec_path = workdir / "job.json"
        staging = str((self.work_root / "staging").resolve())
        spec_path.write_text(self.attempt_job.spec(self.data_dir, str(workdir.resolve()), staging).to_json())
        env = {**os.environ, **role_env(self.layout, role, index), "PYTHONUNBUFFERED": "1",
               "GLOG_minloglevel": os.environ.get("GLOG_minloglevel", "1"), PARENT_PID_ENV: str(os.getpid())}
        popen = subprocess.Popen(
            [sys.executable, "-m", "components.ps.role", str(spec_path)],
            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, bufsize=1,
            start_new_session=True,  # its own process group, so teardown reaches Paddle's children too
        )
        process = Process(role, index, popen, self.log_dir / f"{role.value}-{index}.log", self.attempt)
        pump = threading.Thread(target=self._pump, args=(process,), daemon=True)
        pump.start()
        self.pumps.append(pump)
        return process

    def _pump(self, process: Process) -> None:
        """Copy a process's output to its log (a restarted role's after the failed attempt's); surface progress
        lines."""
        number = process.attempt.number
        with open(process.log_path, "w" if number == 1 else "a") as log:
            if number > 1:
                log.write(f"---- attempt {number} of {self.attempts} (a whole-job restart) ----\n")
            for line in process.popen.stdout:  # type: ignore[union-attr]
                log.write(line)
                log.flush()
                if not line.startswith(HEARTBEAT):  # the tail quoted in an error is for what the process said
                    process.tail.append(line.rstrip("\n"))
                self.events.feed(process.name, line)
                process.attempt.feed(process.name, line)

    def _failure(self, process: Process, what: str, restartable: bool = True) -> RoleFailed:
        time.sleep(0.3)  # let the pump catch the last lines
        tail = "\n".join(f"    {line}" for line in list(process.tail)[-15:])
        why = (f"on attempt {self.attempt.number} of {self.attempts} (cluster.max_restarts="
               f"{self.cfg.cluster.max_restarts})" if restartable
               else "(a configuration error: restarting cannot mend it)")
        # The first line is the whole story (the driver shows only it); the log's last lines follow for the step's log.
        return RoleFailed(process.name, f"PS job {self.job_id}: {process.name} {what} {why}; its log: "
                                        f"{process.log_path}\nLast lines:\n{tail}", what, restartable)

    def _store_refused(self, process: Process) -> PsJobStoreError:
        """A role the checkpoint store refused (a full disk, no permission): one line with the store's own reason,
        the user's to fix (exit 2), no restart."""
        time.sleep(0.3)  # let the pump catch the last lines
        said = next((line for line in reversed(process.tail) if line.startswith(STORE_REFUSED_PREFIX)),
                    f"{STORE_REFUSED_PREFIX}(see the log)")
        return PsJobStoreError(process.name, f"PS job {self.job_id}: {process.name}: {said}; its log: "
                                             f"{process.log_path}")

    def prepare(self) -> None:
        self.work_root.mkdir(parents=True, exist_ok=True)
        self.layout = local_layout(self.cfg.ps.servers, self.cfg.ps.workers, self.cfg.ps.host, self.job_id)

    def where(self) -> str:
        return f"logs in {self.log_dir}"

    def stop_guard(self) -> StopSignals:
        return StopSignals(self._stopped)

    def start(self) -> None:
        """Start the first attempt's processes (a job that cannot start even once fails: ``ps.host``, a port)."""
        self.processes = [self._spawn(Role.SERVER, i) for i in range(self.cfg.ps.servers)]
        self._wait_for_rendezvous()
        self.processes += [self._spawn(Role.WORKER, i) for i in range(self.cfg.ps.workers)]

    def stop(self) -> None:
        alive = [p for p in self.processes if p.popen.poll() is None]
        for p in alive:
            signal_group(p.popen, signal.SIGTERM)
            signal_group(p.popen, signal.SIGCONT)  # a stopped process acts on SIGTERM only once it runs
        deadline = time.time() + TERM_GRACE_S
        for p in alive:
            try:
                p.popen.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                signal_group(p.popen, signal.SIGKILL)
                p.popen.wait()
        for p in self.processes:  # Paddle may leave helpers in the group after its leader exits
            signal_group(p.popen, signal.SIGKILL)
        # A killed process lingers until the kernel has torn it down (a large one, a moment): wait for that, so that
        # nothing of the job is running once stop() returns.
        deadline = time.time() + TERM_GRACE_S
        groups = {p.popen.pid for p in self.processes}
        while _running_in(groups) and time.time() < deadline:
            time.sleep(0.05)

    def result(self, seconds: float) -> JobResult:
        return replace(super().result(seconds),
                       server_memory=[self.server_memory.get(i) for i in range(self.cfg.ps.servers)],
                       restarts=[restart.record() for restart in self.restarts])

    def _stopped(self, signum: int) -> JobStopped:
        return JobStopped("launcher", f"PS job {self.job_id} stopped by {signal.Signals(signum).name}: every process "
                                      "of the job is stopped")

    def _wait_for_rendezvous(self) -> None:
        """Start workers once server 0 serves the gloo store: a worker that finds it down sleeps 3 s per retry."""
        deadline = time.time() + self.cfg.ps.startup_timeout_s
        while not endpoint_accepts(self.layout.gloo_endpoint):
            server_0 = self.processes[0]
            if server_0.popen.poll() is not None:
                raise self._failure(server_0, f"exited with code {server_0.popen.returncode} while starting")
            if time.time() > deadline:
                raise self._failure(server_0, f"did not serve the rendezvous store {self.layout.gloo_endpoint} within "
                                              f"{self.cfg.ps.startup_timeout_s:.0f}s (ps.startup_timeout_s)")
            time.sleep(POLL_S)

    def follow(self) -> None:
        """Return when every process of an attempt exited 0; after a role failed (:meth:`_follow_attempt`), restart
        the whole job (:meth:`_restart`), or raise once no restart is left or none can mend it."""
        while True:
            try:
                if not self.processes:
                    self.start()
                self._follow_attempt()
                return
            except RoleFailed as failed:
                if not failed.restartable or self.attempt.number >= self.attempts:
                    raise
                self._restart(failed)

    def _restart(self, failed: RoleFailed) -> None:
        """Stop every process of the failed attempt, clean the store of its unfinished save, and set up the next
        attempt from the newest intact checkpoint this run committed (else where the first attempt started)."""
        failed_at = time.monotonic()
        self.stop()
        for pump in self.pumps:  # the failed attempt's lines reach its logs and counts before anything is judged
            pump.join(TERM_GRACE_S)
        self.pumps = []
        self._check_store()  # a store that refused this job's lease (a full disk) fails the job, naming that
        try:
            clean_store(self.job.store)
            target = restart_target(self.job.store, self.job.restore, self.attempt.number, self.job.plan.shard_num,
                                    self.job_id, verify=True, warn=lambda line: self.echo(f"warning: {line}"))
            where = position(self.job.store, target)
        except CheckpointStoreError as err:
            raise PsJobStoreError("checkpoint store", f"PS job {self.job_id}: {failed.role} {failed.what}, and the "
                                                      f"restart cannot use the checkpoint store: {err}") from None
        examples, seconds = self.attempt.lost_since(target.id if target is not None and target.resume else None,
                                                    until=failed_at)
        restart = Restart(self.attempt.number, self.attempts, failed.role, failed.what, target, where, examples,
                          seconds)
        self.restarts.append(restart)
        self.echo(restart.line(self.job_id))
        self.attempt_job, self.attempt = replace(self.job, restore=target), Attempt(self.attempt.number + 1)
        self.events.new_attempt()
        self.liveness.new_attempt(self.job_id)
        self.processes = []
        self.layout = local_layout(self.cfg.ps.servers, self.cfg.ps.workers, self.cfg.ps.host, self.job_id)

    def _follow_attempt(self) -> None:
        """Return when every process exited 0; raise on the first failure or a stuck ending.

        Only worker 0 stops the servers, and only after the final barrier, so the ending starts when
        the first server or the last worker exits cleanly; from then on, everyone has SERVER_EXIT_S to go.
        """
        workers = [p for p in self.processes if p.role is Role.WORKER]
        ending_since: Optional[float] = None
        while True:
            self._sample_server_memory()
            codes = [p.popen.poll() for p in self.processes]
            for p, code in zip(self.processes, codes):
                if code == STORE_REFUSED_EXIT:
                    raise self._store_refused(p)
                if code not in (None, 0):
                    raise self._failure(p, f"exited with code {code}{_signal_name(code)}", code not in NOT_RESTARTED)
            if all(code == 0 for code in codes):
                return
            self._check_store()
            self._check_stalls()
            if ending_since is None and (
                    any(p.role is Role.SERVER and c == 0 for p, c in zip(self.processes, codes))
                    or all(p.popen.poll() == 0 for p in workers)):
                ending_since = time.time()
            if ending_since is not None and time.time() - ending_since > SERVER_EXIT_S:
                stuck = next(p for p in self.processes if p.popen.poll() is None)
                raise self._failure(stuck, f"did not exit within {SERVER_EXIT_S:.0f}s of the job's end")
            time.sleep(POLL_S)

    def _check_store(self) -> None:
        check_lease(self.lease, f"PS job {self.job_id}")

    def _check_stalls(self) -> None:
        """A process whose heartbeat record stops changing for ps.stall_timeout_s fails the attempt (a stopped one is
        named first)."""
        running = {p.name: p for p in self.processes if p.popen.poll() is None}
        self.liveness.poll()
        stalled = self.liveness.stalled({name: p.started for name, p in running.items()})
        if not stalled:
            return
        name, silent = next(((n, s) for n, s in stalled if process_state(running[n].popen.pid) == "T"), stalled[0])
        stopped = " (its process is stopped: state T)" if process_state(running[name].popen.pid) == "T" else ""
        raise self._failure(running[name], stall_what(silent, self.cfg.ps.stall_timeout_s) + stopped)

    def _sample_server_memory(self) -> None:
        """Each server's RSS from the first sample after it reported serving (its table still empty: workers
        push only once every server listens) and its peak since: what the memory plan estimates."""
        for p in self.processes:
            if p.role is not Role.SERVER or self.progress.get(p.name, {}).get("state") is None:
                continue
            rss = _rss_bytes(p.popen.pid)
            if rss is None:  # exited (or exiting: a zombie has no RSS)
                continue
            memory = self.server_memory.setdefault(p.index, {"serving_rss": rss, "peak_rss": rss})
            memory["peak_rss"] = max(memory["peak_rss"], rss)


def _rss_bytes(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _running_in(groups: set[int]) -> bool:
    """Whether any process of these process groups is still running (zombies, which have exited, aside)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # After the command's closing parenthesis: state, ppid, pgrp.
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue
        if int(pgrp) in groups and state != "Z":
            return True
    return False


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return f" (killed by {signal.Signals(-code).name})"
        except ValueError:
            return ""
    return ""
