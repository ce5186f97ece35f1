"""CPU a TLS terminator pair spends per GB of PS-like traffic: HAProxy (the job's) against stunnel, side by side.

    python bench/tls_terminators.py [--rounds 6000] [--repeats 3]

A client sends a 30 KB request and reads a 120 KB reply (about a pull's sizes at the default batch), on 4
connections, through a client-side terminator and a server-side one on loopback to an echo server: what a worker's
dial to a server crosses with ``ps.tls`` on. Both pairs use the job's own credentials (a per-job CA, P-256) and
mutual TLS. Printed: the terminators' CPU seconds (user + system, from /proc) per GB carried, per run, and the
median. HAProxy's configuration is the job's (:func:`components.ps.tls.terminator_config`: one thread, 64 KB
buffers); stunnel's is the one the job used before it (:func:`stunnel_config`). Needs ``stunnel`` and ``haproxy``
(Debian: stunnel4, haproxy).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.ps import tls  # noqa: E402
from components.ps.contract import wait_until_listening  # noqa: E402
from components.ps.tls_certs import issue_job_credentials  # noqa: E402

REQUEST, REPLY, CONNECTIONS = 30_000, 120_000, 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def echo_server(port: int) -> socket.socket:
    listener = socket.create_server(("127.0.0.1", port))

    def serve(conn: socket.socket) -> None:
        with conn:
            while True:
                got = 0
                while got < REQUEST:
                    data = conn.recv(1 << 20)
                    if not data:
                        return
                    got += len(data)
                conn.sendall(b"r" * REPLY)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener


def exchange(port: int, rounds: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = b"q" * REQUEST
        for _ in range(rounds):
            conn.sendall(request)
            got = 0
            while got < REPLY:
                got += len(conn.recv(1 << 20))


def cpu_seconds(pids: list[int]) -> float:
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime: every thread of the process
    return ticks / os.sysconf("SC_CLK_TCK")


def stunnel_config(name: str, accept: str, connect: str, directory: Path, client: bool) -> str:
    """The job's stunnel service until HAProxy replaced it: mutual TLS 1.2+, the job's CA only, Nagle off."""
    lines = ["foreground = yes", "pid =", "syslog = no", "debug = warning", f"cert = {directory}/role.crt",
             f"key = {directory}/role.key", f"CAfile = {directory}/{tls.CA_FILE}", "verifyChain = yes",
             "requireCert = yes", "sslVersionMin = TLSv1.2", "socket = l:TCP_NODELAY=1", "socket = r:TCP_NODELAY=1",
             f"[{name}]", f"accept = {accept}", f"connect = {connect}"]
    return "\n".join(lines + (["client = yes", "checkHost = localhost"] if client else [])) + "\n"


def pair(kind: str, directory: Path, backend: int, network: int, local: int) -> list[list[str]]:
    """The commands of a server-side and a client-side terminator of ``kind``."""
    if kind == "stunnel":
        server = stunnel_config("in", f"127.0.0.1:{network}", f"127.0.0.1:{backend}", directory, client=False)
        client = stunnel_config("out", f"127.0.0.1:{local}", f"127.0.0.1:{network}", directory, client=True)
        suffix, command = ".conf", ["stunnel"]
    else:
        server = tls.terminator_config([tls.Tunnel("in", f"127.0.0.1:{network}", f"127.0.0.1:{backend}", client=False)],
                                       "role.pem", tls_dir=str(directory))
        client = tls.terminator_config([tls.Tunnel("out", f"127.0.0.1:{local}", f"127.0.0.1:{network}", client=True,
                                                   peer="localhost")], "role.pem", tls_dir=str(directory))
        suffix, command = ".cfg", ["haproxy", "-db", "-f"]
    commands = []
    for name, text in (("server", server), ("client", client)):
        path = directory / f"{kind}-{name}{suffix}"
        path.write_text(text)
        commands.append([*command, str(path)])
    return commands


def measure(kind: str, directory: Path, rounds: int) -> float:
    backend, network, local = free_port(), free_port(), free_port()
    listener = echo_server(backend)
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for c in pair(kind, directory, backend, network, local)]
    try:
        wait_until_listening([f"127.0.0.1:{network}", f"127.0.0.1:{local}"], 10, hold_s=0)
        before = cpu_seconds([p.pid for p in procs])
        clients = [threading.Thread(target=exchange, args=(local, rounds // CONNECTIONS)) for _ in range(CONNECTIONS)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        used = cpu_seconds([p.pid for p in procs]) - before
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        listener.close()
    return used / (rounds // CONNECTIONS * CONNECTIONS * (REQUEST + REPLY) / 1e9)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6000, help="request/reply exchanges per run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    missing = [tool for tool in ("stunnel", "haproxy") if shutil.which(tool) is None]
    if missing:
        print(f"error: {' and '.join(missing)} not installed (Debian: apt-get install stunnel4 haproxy)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        issued = issue_job_credentials("bench", {"localhost": []})["localhost"]
        (directory / "role.crt").write_bytes(issued.cert)
        (directory / "role.key").write_bytes(issued.key)
        (directory / tls.CA_FILE).write_bytes(issued.ca)
        (directory / "role.pem").write_bytes(issued.cert + issued.key)
        runs: dict[str, list[float]] = {"stunnel": [], "haproxy": []}
        for repeat in range(args.repeats):
            for kind in runs:  # interleaved: both see the same machine
                runs[kind].append(measure(kind, directory, args.rounds))
                print(f"run {repeat + 1}: {kind} {runs[kind][-1]:.2f} CPU-s/GB", flush=True)
    stunnel, haproxy = (statistics.median(runs[k]) for k in ("stunnel", "haproxy"))
    print(f"| terminator pair | CPU-s per GB (median of {args.repeats}) |\n|---|---|\n"
          f"| stunnel (the job's until 2026-12-05) | {stunnel:.2f} |\n| HAProxy (the job's) | {haproxy:.2f} "
          f"({haproxy / stunnel:.2f}x) |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
