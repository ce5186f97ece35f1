"""The contract between one PS process and whoever starts it (a local launcher, a pod, a compose service).

What crosses it, and nothing else:

* **environment**: :func:`role_env` turns a :class:`ClusterLayout` into each process's Paddle variables; every
  backend computes the endpoints up front and calls it, so a server or worker sees the same variables
  wherever it runs. Besides those: the job spec (:data:`SPEC_ENV`, or a file path argument), the restart
  attempt of a whole-job restart (:data:`RESTART_ENV`) and, where the spec cannot carry it, the run
  (:data:`RUN_ID_ENV`);
* **the job spec** (:class:`JobSpec`): the user's config, the job's plan (:class:`JobPlan`: what was resolved
  for it before it started, which every role must agree on), where the dataset is, the process's scratch
  directories and what to restore;
* **events**: the process prints one JSON event per line (:func:`emit`), tagged :data:`PROGRESS`,
  :data:`EPOCH`, :data:`CHECKPOINT`, :data:`DONE` or :data:`HEARTBEAT` (at least one every
  ``ps.progress_period_s`` while the process works: :mod:`components.ps.liveness`); launchers read them with
  :func:`parse_event`;
* **readiness**: a server is ready for workers once an endpoint accepts TCP and holds the connection
  (:func:`ready_probe_command`);
* **exit status**: 0 when the process's part of the job is done; :data:`CONFIG_ERROR_EXIT` when its job spec,
  config or environment cannot work, and :data:`STORE_REFUSED_EXIT` when the checkpoint store refused a write for
  good, which no restart can mend (launchers fail the job at once); anything else is a failure a whole-job restart
  from the latest checkpoint may get past.

The process side is :mod:`components.ps.role`; it imports nothing of the orchestration layers (kfp,
kubernetes), and neither does this module.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Mapping, Optional

from components.checkpoint.restore import RestoreTarget
from components.table.memory import MemoryPlan

SPEC_ENV = "PS_JOB_SPEC"  # the job spec as JSON, when no spec file is given (pods, compose services)
RESTART_ENV = "PS_RESTART_ATTEMPT"  # how many times the whole job was restarted before this attempt
# The run, when its launcher names it only at start (a compose file is written once and run many times: the driver
# names each run), in place of the job spec's ``run_id``.
RUN_ID_ENV = "PS_RUN_ID"
INDEX_ENV = "PS_ROLE_INDEX"  # the process's index among its role
ROLE_ENV = "PS_ROLE"  # server | worker
# The exit status of a process whose job spec, config or environment cannot work (sysexits.h EX_CONFIG).
CONFIG_ERROR_EXIT = 78
# The checkpoint store refused a write for good (a full disk, no permission, no credentials: StoreRefused), said on
# the process's last line after STORE_REFUSED_PREFIX: the user's to fix, which no restart mends (sysexits' EX_IOERR).
STORE_REFUSED_EXIT = 74
STORE_REFUSED_PREFIX = "checkpoint store refused: "
# Event tags: the first word of an event line, then its JSON payload.
PROGRESS, EPOCH, CHECKPOINT, DONE = "@progress", "@epoch", "@checkpoint", "@done"
HEARTBEAT = "@heartbeat"  # alive, nothing else to report: {role, index, waiting (in a collective)}
# Day-by-day training: the restored model scored on the new day's rows before any training on them (worker 0).
DAY_EVAL = "@day-eval"
EVENT_TAGS = (PROGRESS, EPOCH, CHECKPOINT, DONE, HEARTBEAT, DAY_EVAL)


class Role(str, Enum):
    SERVER = "server"
    WORKER = "worker"


@dataclass(frozen=True)
class ClusterLayout:
    """Who listens where. ``gloo_endpoint`` is the rendezvous store that server 0 serves."""

    server_endpoints: tuple[str, ...]
    worker_endpoints: tuple[str, ...]
    gloo_endpoint: str
    job_id: str

    @property
    def servers(self) -> int:
        return len(self.server_endpoints)

    @property
    def workers(self) -> int:
        return len(self.worker_endpoints)

    def endpoint(self, role: Role, index: int) -> str:
        endpoints = self.server_endpoints if role is Role.SERVER else self.worker_endpoints
        return endpoints[index]


def role_env(layout: ClusterLayout, role: Role, index: int) -> dict[str, str]:
    """Environment for one process. A server's POD_IP:PADDLE_PORT must equal its entry in the list."""
    ip, port = layout.endpoint(role, index).rsplit(":", 1)
    env = {
        "TRAINING_ROLE": "PSERVER" if role is Role.SERVER else "TRAINER",
        "PADDLE_PSERVERS_IP_PORT_LIST": ",".join(layout.server_endpoints),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(layout.worker_endpoints),
        "PADDLE_TRAINERS_NUM": str(layout.workers),
        "POD_IP": ip,
        "PADDLE_PORT": port,
        # Workers barrier and all-reduce AUC statistics through gloo; server 0 hosts the HTTP store.
        "PADDLE_WITH_GLOO": "1",
        "PADDLE_GLOO_RENDEZVOUS": "3",
        "PADDLE_GLOO_HTTP_ENDPOINT": layout.gloo_endpoint,
        "SYS_JOB_ID": layout.job_id,
        ROLE_ENV: role.value,
        INDEX_ENV: str(index),
    }
    if role is Role.WORKER:
        env["PADDLE_TRAINER_ID"] = str(index)
        # Paddle's own wait for servers retries every 3 s; the worker polls them itself (role.py).
        env["FLAGS_LAUNCH_BARRIER"] = "0"
    return env


def layout_from_env(environ: Mapping[str, str]) -> ClusterLayout:
    """The layout :func:`role_env` wrote into a process's environment."""
    return ClusterLayout(tuple(environ["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")),
                         tuple(environ["PADDLE_TRAINER_ENDPOINTS"].split(",")),
                         environ["PADDLE_GLOO_HTTP_ENDPOINT"], environ["SYS_JOB_ID"])


def host_layout(host: Callable[[Role, int], str], servers: int, workers: int, port: int, gloo_port: int,
                job_id: str) -> ClusterLayout:
    """A layout where every process listens on the same port of a host of its own (a pod, a container),
    named by ``host(role, index)``; server 0 also serves the rendezvous store on ``gloo_port``."""
    return ClusterLayout(
        server_endpoints=tuple(f"{host(Role.SERVER, i)}:{port}" for i in range(servers)),
        worker_endpoints=tuple(f"{host(Role.WORKER, i)}:{port}" for i in range(workers)),
        gloo_endpoint=f"{host(Role.SERVER, 0)}:{gloo_port}",
        job_id=job_id,
    )


@dataclass(frozen=True)
class JobPlan:
    """What a job resolved before it started (:func:`components.train.planner.job_plan`), beside its config, which
    stays as the user wrote it: the roles read these values here, never from the config.

    ``shard_num``: the sparse table's shard count (a restored table keeps its own; ``shard_source`` says where it
    comes from); ``negative_sample_rate``: the rate the data was prepared with (its ``stats.json``), which every
    program corrects its predictions for and the checkpoint records; ``memory``: the table's memory plan (None in geo
    mode).
    """

    shard_num: int
    shard_source: str
    negative_sample_rate: float
    memory: Optional[MemoryPlan] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "JobPlan":
        memory = raw.get("memory")
        return cls(shard_num=int(raw["shard_num"]), shard_source=raw["shard_source"],
                   negative_sample_rate=float(raw["negative_sample_rate"]),
                   memory=MemoryPlan(**memory) if memory else None)


@dataclass(frozen=True)
class JobSpec:
    """Everything a role process needs besides its environment.

    ``config``: the user's config as a dict (:func:`components.config.to_dict`); ``plan``: what the job resolved
    before it started, which every role must agree on (:class:`JobPlan`); ``data_dir``: the prepared dataset, a
    local path or a remote fsspec URL (pods fetch their shards); ``workdir``: the process's scratch directory;
    ``staging_dir``: where servers save table shards before their uploader moves them to the store (the same path
    string on every machine); ``restore``: what the job starts from; ``run_id``: the run, recorded in every
    checkpoint it commits (a restarted job resumes only its own run's checkpoints); ``baseline``: the fitted
    baseline's directory (a local path or a remote fsspec URL) a model that blends it in (``model.blend_baseline``)
    scores with, when the checkpoint it starts from holds none; ``baseline_beside``: it is fitted beside the job
    (on Kubeflow) and published at the URL ``baseline`` later: a worker waits for it when it first needs it
    (:mod:`components.networks.baseline_handoff`).
    """

    config: dict
    plan: JobPlan
    data_dir: str
    workdir: str
    staging_dir: str
    restore: Optional[RestoreTarget] = None
    run_id: str = ""
    baseline: str = ""
    baseline_beside: bool = False

    def to_json(self) -> str:
        return json.dumps({"config": self.config, "plan": self.plan.to_dict(), "data_dir": self.data_dir,
                           "workdir": self.workdir, "staging_dir": self.staging_dir, "run_id": self.run_id,
                           "baseline": self.baseline, "restore": self.restore.to_dict() if self.restore else None,
                           **({"baseline_beside": True} if self.baseline_beside else {})},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        raw = json.loads(text)
        restore = raw.get("restore")
        return cls(config=raw["config"], plan=JobPlan.from_dict(raw["plan"]), data_dir=raw["data_dir"],
                   workdir=raw["workdir"], staging_dir=raw["staging_dir"],
                   restore=RestoreTarget.from_dict(restore) if restore else None, run_id=raw.get("run_id", ""),
                   baseline=raw.get("baseline", ""), baseline_beside=raw.get("baseline_beside", False))

    @classmethod
    def load(cls, path: Optional[str]) -> "JobSpec":
        """The spec a process was started with: the file ``path``, else ``$PS_JOB_SPEC``."""
        return cls.from_json(Path(path).read_text() if path else os.environ[SPEC_ENV])


_EMIT_LOCK = threading.Lock()


def emit(tag: str, **payload) -> None:
    """One event per line, written whole: a progress thread and the main thread both emit, and ``print``
    writes the text and the newline separately, so unlocked events could share a line."""
    line = f"{tag} {json.dumps(payload)}\n"
    with _EMIT_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


def parse_event(line: str) -> Optional[tuple[str, dict]]:
    """``(tag, payload)`` of an event line; None for any other line (or an event garbled by native output)."""
    tag, _, payload = line.strip().partition(" ")
    if tag not in EVENT_TAGS:
        return None
    try:
        return tag, json.loads(payload)
    except json.JSONDecodeError:
        return None


# How long a probe's connection must stay open. A TLS tunnel (components/ps/tls.py) accepts at once and closes the
# connection moments later when the peer behind it refuses; a listening PS port or store waits for a request.
HOLD_S = 0.2


def endpoint_accepts(endpoint: str, hold_s: float = HOLD_S) -> bool:
    """Whether ``endpoint`` accepts a TCP connection and keeps it open for ``hold_s`` (0: accepting is enough)."""
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5) as conn:
            if not hold_s:
                return True
            conn.settimeout(hold_s)
            try:
                return conn.recv(1) != b""  # b"": closed at once, by a tunnel whose peer is not listening
            except socket.timeout:
                return True
    except OSError:
        return False


def wait_until_listening(endpoints: list[str], timeout_s: float, poll_s: float = 0.1, hold_s: float = HOLD_S) -> None:
    """Block until every endpoint accepts TCP connections (:func:`endpoint_accepts`); TimeoutError names those that
    do not."""
    deadline = time.time() + timeout_s
    pending = list(endpoints)
    while pending:
        pending = [ep for ep in pending if not endpoint_accepts(ep, hold_s)]
        if pending and time.time() > deadline:
            raise TimeoutError(f"PS servers {pending} did not listen within {timeout_s:.0f}s")
        if pending:
            time.sleep(poll_s)


def ready_probe_command(endpoints: list[str]) -> list[str]:
    """A container's readiness check: exits 0 once any of ``endpoints`` accepts TCP."""
    return ["python", "-m", "components.ps.contract", "ready", *endpoints]


def main(argv: list[str]) -> int:
    if argv[:1] != ["ready"] or len(argv) < 2:
        print("usage: python -m components.ps.contract ready ENDPOINT [ENDPOINT...]", file=sys.stderr)
        return 2
    return 0 if any(map(endpoint_accepts, argv[1:])) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
