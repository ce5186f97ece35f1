"""Bytes on the wire of a running PS job, from the kernel's own per-connection counters.

``ss -tin`` reports, for every established TCP connection, ``bytes_received`` (payload the socket took in) and
``bytes_acked`` (payload it sent that the peer acknowledged). Read on the servers' side of the connections to their PS
ports, they are the bytes the workers sent the servers (pushes, pull requests) and the bytes the servers sent back
(pull answers), per server; the gloo rendezvous and the workers' barriers are not on those ports and are left out.
Interface counters (``/proc/net/dev``) would not do: they count a whole network namespace, and every process of a
local job shares one with everything else on the machine.

The counters die with their connection, so :class:`WireBytes` samples them every ``period_s`` while the job runs and
keeps each connection's largest value; the bytes sent after the last sample (at most ``period_s`` of the job's end)
are not counted.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Optional

_COUNTER = re.compile(r"\b(bytes_acked|bytes_received):(\d+)")


@dataclass
class ServerBytes:
    """What one server's PS port carried: ``received`` from the workers, ``sent`` to them."""
    received: int = 0
    sent: int = 0

    @property
    def total(self) -> int:
        return self.received + self.sent


def parse_ss(text: str, ports: Iterable[int]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """``{(local, peer): (local port, bytes_received, bytes_acked)}`` of the connections ``ss -tinH`` lists whose
    local port is one of ``ports`` (the servers' ends)."""
    wanted = set(ports)
    found = {}
    lines = text.splitlines()
    for head, info in zip(lines[::2], lines[1::2]):
        fields = head.split()
        if len(fields) < 4:
            continue
        local, peer = fields[-2], fields[-1]
        port = int(local.rpartition(":")[2])
        if port not in wanted:
            continue
        counters = dict(_COUNTER.findall(info))
        found[(local, peer)] = (port, int(counters.get("bytes_received", 0)), int(counters.get("bytes_acked", 0)))
    return found


def ss_command(netns_pid: Optional[int] = None) -> list[str]:
    """``ss`` over established TCP connections, in the network namespace of ``netns_pid`` (a container's) if given."""
    ss = ["ss", "-tinH", "state", "established"]
    return ["nsenter", "-t", str(netns_pid), "-n", *ss] if netns_pid else ss


@dataclass
class WireBytes:
    """Samples the servers' PS connections until stopped. ``ports()`` names the servers' PS ports once they are
    known (None before the job has chosen them); ``netns_pids()`` the network namespaces to look in (one ``ss`` per
    namespace; empty: this process's own)."""
    ports: Callable[[], Optional[dict[int, int]]]  # PS port -> server index
    netns_pids: Callable[[], list[int]] = list
    period_s: float = 0.25
    _peak: dict[tuple[str, str, str], tuple[int, int, int]] = field(default_factory=dict)
    _ports: dict[int, int] = field(default_factory=dict)  # the job's, once known
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None

    def __enter__(self) -> "WireBytes":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        ports = self._ports = self._ports or self.ports() or {}
        if not ports:
            return
        for pid in self.netns_pids() or [None]:
            out = subprocess.run(ss_command(pid), capture_output=True, text=True).stdout
            for (local, peer), (port, received, sent) in parse_ss(out, ports).items():
                key = (str(pid), local, peer)
                old = self._peak.get(key, (port, 0, 0))
                self._peak[key] = (port, max(old[1], received), max(old[2], sent))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def per_server(self) -> list[ServerBytes]:
        """Bytes per server, in server order."""
        self.sample()  # the counters' last values, if the connections are still up
        ports = self._ports
        servers = [ServerBytes() for _ in range(len(set(ports.values())))]
        for port, received, sent in self._peak.values():
            server = servers[ports[port]]
            server.received += received
            server.sent += sent
        return servers


def local_job_ports(marker: str) -> Optional[dict[int, int]]:
    """The PS ports of the local job whose role processes' command lines hold ``marker`` (its log directory):
    ``{port: server index}`` from a role's ``PADDLE_PSERVERS_IP_PORT_LIST``; None until a role has started."""
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    for pid in out.split():
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                env = dict(item.split(b"=", 1) for item in environ.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        endpoints = env.get(b"PADDLE_PSERVERS_IP_PORT_LIST", b"").decode()
        if endpoints:
            return {int(ep.rpartition(":")[2]): i for i, ep in enumerate(endpoints.split(","))}
    return None
