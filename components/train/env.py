"""The one place that turns a PS cluster layout into each process's Paddle environment.

Every launcher backend (local processes today, Kubernetes pods later) computes the endpoints up front
and calls :func:`role_env`, so a server or worker sees the same variables wherever it runs.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable


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
        "PS_ROLE": role.value,
        "PS_ROLE_INDEX": str(index),
    }
    if role is Role.WORKER:
        env["PADDLE_TRAINER_ID"] = str(index)
        # Paddle's own wait for servers retries every 3 s; the worker polls them itself (role.py).
        env["FLAGS_LAUNCH_BARRIER"] = "0"
    return env


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


def wait_until_listening(endpoints: list[str], timeout_s: float, poll_s: float = 0.1) -> None:
    """Block until every endpoint accepts TCP connections; TimeoutError names those that do not."""
    deadline = time.time() + timeout_s
    pending = list(endpoints)
    while pending:
        pending = [ep for ep in pending if not endpoint_accepts(ep)]
        if pending and time.time() > deadline:
            raise TimeoutError(f"PS servers {pending} did not listen within {timeout_s:.0f}s")
        if pending:
            time.sleep(poll_s)


def endpoint_accepts(endpoint: str) -> bool:
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False
