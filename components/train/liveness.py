"""Whether a PS job's roles are alive, judged the same way on every backend: from the heartbeat records the roles
write into the checkpoint store (:class:`components.ps.liveness.HeartbeatRecord`), under one stall rule
(:func:`stalled`).

The store is the one thing every backend shares (a pod has no API token, and the Kubernetes launcher follows worker
0's log only), so the local launcher, the Kubernetes launcher and a compose job's ``watch`` service
(:func:`watch`) each poll a :class:`Liveness` on it. A record counts as a report when it changed since the reader
last saw it, on the reader's own clock (hosts' clocks may differ). A store the reader cannot read for a while is
nobody's silence: once it answers again, every role's clock starts afresh (its lease tells whether the job may go
on: :func:`components.train.job.check_lease`).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from components.checkpoint.lease import StoreLease
from components.checkpoint.store import CheckpointStore, CheckpointStoreError
from components.ps.contract import Role
from components.ps.liveness import LIVENESS
from components.train.job import RoleFailed, check_lease

_RECORD_NAME = re.compile(r"^(server|worker)-\d+\.json$")  # not a write's temporary file
READ_EVERY_S = 1.0  # how often a launcher reads the records: a beat comes every ps.progress_period_s (>= 1 s)
WATCH_POLL_S = 1.0


def stalled(running: dict[str, float], reports: dict[str, tuple[float, bool]], server_work: dict[str, float],
            stall_s: float, first_report_s: float, now: float) -> list[tuple[str, float]]:
    """``(source, seconds silent)`` of the stalled roles among ``running`` (source -> when it started), longest
    silent first; ``reports``: source -> (when it last reported, whether it said it waits in a collective);
    ``server_work``: server -> when its save or upload last advanced. All times on one clock, ``now`` on it.

    A role is stalled when it has reported nothing for ``stall_s`` (before its first report, for
    ``first_report_s``), except a worker whose last report said it waits in a collective while another worker
    that is not waiting reported within ``stall_s``, or a server's save or upload advanced within it (a checkpoint
    of a large table takes minutes): it waits for that one. A job whose every worker waits is stalled: nobody is
    left to end the wait.
    """
    working = any(not waiting and now - when <= stall_s for source, (when, waiting) in reports.items()
                  if source in running and source.startswith(Role.WORKER.value)) or \
        any(now - when <= stall_s for source, when in server_work.items() if source in running)
    out = []
    for source, started in running.items():
        report = reports.get(source)
        since, limit = (report[0], stall_s) if report else (started, first_report_s)
        if now - since > limit and not (report and report[1] and working):
            out.append((source, now - since))
    return sorted(out, key=lambda item: -item[1])


@dataclass
class Liveness:
    """The heartbeat records of job ``job`` (the roles' ``SYS_JOB_ID``) in ``store``, as last read.

    ``on_progress(source, epoch, examples)``: given each worker record that carries its pass's progress (what a
    restart loses is counted from them: :class:`components.train.restarts.Attempt`).
    """

    store: CheckpointStore
    job: str
    stall_s: float
    first_report_s: float
    on_progress: Optional[Callable[[str, int, int], None]] = None
    clock: Callable[[], float] = time.monotonic
    reports: dict[str, tuple[float, bool]] = field(default_factory=dict)
    server_work: dict[str, float] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    _stamps: dict[str, tuple] = field(default_factory=dict)
    _read_at: float = -math.inf
    _blind: bool = False

    def new_attempt(self, job: str) -> None:
        """A restarted job (``job``: its roles' job id): the failed attempt's records say nothing of its roles."""
        self.job = job
        self.reports.clear()
        self.server_work.clear()
        self.done.clear()
        self._stamps.clear()
        self._read_at = -math.inf

    def poll(self) -> None:
        """Read the records, at most every :data:`READ_EVERY_S`."""
        now = self.clock()
        if now - self._read_at < READ_EVERY_S:
            return
        self._read_at = now
        try:
            records = [self.store.read_json(None, f"{LIVENESS}/{name}")
                       for name in self.store.list_control(LIVENESS) if _RECORD_NAME.match(name)]
        except CheckpointStoreError:
            self._blind = True
            return
        if self._blind:  # what the roles could not write meanwhile is not their silence
            self._blind = False
            self.reports = {source: (now, waiting) for source, (_, waiting) in self.reports.items()}
            self.server_work = {source: now for source in self.server_work}
        for record in records:
            if record is not None and record.get("job") == self.job:
                self._take(record, now)

    def _take(self, record: dict, now: float) -> None:
        source = f"{record['role']}-{record['index']}"
        stamp = (record.get("seq"), record.get("time"))
        if self._stamps.get(source) == stamp:
            return
        self._stamps[source] = stamp
        self.reports[source] = (now, bool(record.get("waiting")))
        if record.get("work"):
            self.server_work[source] = now
        if record.get("done"):
            self.done.add(source)
        if self.on_progress is not None and record.get("examples") is not None:
            self.on_progress(source, int(record["epoch"]), int(record["examples"]))

    def stalled(self, running: dict[str, float]) -> list[tuple[str, float]]:
        """:func:`stalled` among ``running`` (source -> when it started, on this reader's clock)."""
        return stalled(running, self.reports, self.server_work, self.stall_s, self.first_report_s, self.clock())

    def workers_done(self, workers: int) -> bool:
        return all(f"{Role.WORKER.value}-{i}" in self.done for i in range(workers))


def role_names(servers: int, workers: int) -> list[str]:
    return [f"{Role.SERVER.value}-{i}" for i in range(servers)] + [f"{Role.WORKER.value}-{i}" for i in range(workers)]


def stall_what(silent: float, stall_s: float) -> str:
    """What a stalled role did, in the phrase every backend's failure and restart line quote."""
    return f"reported nothing for {silent:.0f}s (ps.stall_timeout_s={stall_s:g}): it is stopped or hung"


def watch(liveness: Liveness, servers: int, workers: int, lease: Optional[StoreLease],
          poll_s: float = WATCH_POLL_S) -> None:
    """Follow a job that nothing else follows (compose's ``watch`` service) until every worker recorded it is done;
    raise :class:`RoleFailed` when a role stalls, :class:`components.train.job.PsJobStoreError` when the job lost
    its store ``lease``."""
    started = liveness.clock()
    while True:
        check_lease(lease, f"PS job {liveness.job}")
        liveness.poll()
        if liveness.workers_done(workers):
            return
        running = {name: started for name in role_names(servers, workers) if name not in liveness.done}
        found = liveness.stalled(running)
        if found:
            source, silent = found[0]
            what = stall_what(silent, liveness.stall_s)
            raise RoleFailed(source, f"PS job {liveness.job}: {source} {what}", what, restartable=True)
        time.sleep(poll_s)
