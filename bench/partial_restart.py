"""Can Paddle 2.6.2 restart less than a whole PS job? One role of a running compose job is killed and only it is
started again, and what the job does next is watched.

    sudo python bench/partial_restart.py [--rows 400000] [--watch-s 120] [--out bench/results/partial_restart.md]

The compose job (2 servers + 2 workers, two passes, the checkout's code mounted, as ``bench/network.py`` runs it)
is started service by service, without the driver and without the ``watch`` service, so that nothing restarts the
whole job. Once worker 0 reports progress in pass 2 (a checkpoint of pass 1 is committed):

* **worker**: worker 1 is killed (``podman kill``) and its container started again, the same environment and job
  spec: whether it trains again (a progress line of its own), and whether the job ends;
* **server**: server 1 is killed and started again: whether the workers train on, and with what table (the rows
  server 1 holds in the job's last checkpoint, against the undisturbed job's).

Per case the table says what happened within ``--watch-s`` seconds and the last line each role logged. Everything
created is removed at the end. Needs root (podman).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import log, publish  # noqa: E402
from bench.network import CONTAINERS_CONF, project_file  # noqa: E402
from bench.network import down as network_down  # noqa: E402

PROJECT = "ctr-partial"
RESULTS = ROOT / "bench" / "results" / "partial_restart.md"
PROGRESS = re.compile(r"^@progress (\{.*\})$", re.M)
CHECKPOINT = re.compile(r"^@checkpoint (\{.*\})$", re.M)
EPOCH = re.compile(r"^@epoch (\{.*\})$", re.M)
SERVICES = ("ps-0", "ps-1", "worker-0", "worker-1")


def podman(*args: str, check: bool = True, timeout: float = 300) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode:
        raise RuntimeError(f"podman {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def container(service: str) -> str:
    return f"{PROJECT}_{service}_1"


def logs(service: str, since: Optional[float] = None) -> str:
    extra = ["--since", str(int(since))] if since else []
    return podman("logs", *extra, container(service), check=False)


def state(service: str) -> str:
    return podman("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", container(service), check=False)


def progress(service: str, since: Optional[float] = None) -> list[dict]:
    return [json.loads(m) for m in PROGRESS.findall(logs(service, since))]


def last_line(service: str) -> str:
    """Its last line that is not a heartbeat (what it did, or the error it ended with)."""
    lines = [line for line in logs(service).splitlines() if line.strip() and not line.startswith("@heartbeat")]
    return lines[-1][:160] if lines else "(nothing)"


def compose_file(work: Path, rows: int) -> Path:
    return project_file(work / "compose.yaml", PROJECT, [f"data.rows={rows}", "ps.epochs=2"])


def down(path: Path) -> None:
    network_down(path, PROJECT)


def start_job(path: Path) -> None:
    """prep, then the servers (until their healthchecks pass), then the workers: compose_up.py's order, no watch."""
    subprocess.run(["podman-compose", "-p", PROJECT, "-f", str(path), "up", "--no-start"], capture_output=True,
                   text=True, check=True)
    podman("start", container("prep"))
    if podman("wait", container("prep"), timeout=600) != "0":
        raise RuntimeError(f"data prep failed: {last_line('prep')}")
    for server in ("ps-0", "ps-1"):
        podman("start", container(server))
    deadline = time.time() + 120
    while not all(subprocess.run(["podman", "healthcheck", "run", container(s)], capture_output=True).returncode == 0
                  for s in ("ps-0", "ps-1")):
        if time.time() > deadline:
            raise RuntimeError("the servers were not ready in 120 s")
        time.sleep(1)
    for worker in ("worker-0", "worker-1"):
        podman("start", container(worker))


def wait_for_pass_2(limit_s: float = 300) -> None:
    deadline = time.time() + limit_s
    while not any(p.get("epoch", 0) >= 2 for p in progress("worker-0")):
        if time.time() > deadline:
            raise RuntimeError(f"worker 0 never reached pass 2: {last_line('worker-0')}")
        time.sleep(0.5)


def watch(watch_s: float, restarted_at: float, role: str) -> dict:
    """What the job did within ``watch_s`` of the restart: the roles' progress and ends."""
    deadline = time.time() + watch_s
    while time.time() < deadline and any(state(w).startswith("running") for w in ("worker-0", "worker-1")):
        time.sleep(2)
    found = {"role": role, "states": {s: state(s) for s in SERVICES}, "last": {s: last_line(s) for s in SERVICES}}
    # The examples each worker reported in its pass after the restart (repeated reports of one count: no progress).
    found["progress_after"] = {w: sorted({p["examples"] for p in progress(w, restarted_at) if "examples" in p})
                               for w in ("worker-0", "worker-1")}
    found["passes_ended"] = len(EPOCH.findall(logs("worker-0", restarted_at)))
    checkpoints = [json.loads(m) for m in CHECKPOINT.findall(logs("worker-0"))]
    found["server_rows"] = [c.get("servers", {}).get("rows") for c in checkpoints]
    return found


def case(path: Path, role: str, service: str, watch_s: float) -> dict:
    down(path)
    start_job(path)
    wait_for_pass_2()
    podman("kill", container(service))
    podman("wait", container(service), check=False)
    restarted_at = time.time()
    podman("start", container(service))
    log(f"{service} killed and started again")
    return watch(watch_s, restarted_at, role)


def render(rows: list[dict], args) -> str:
    lines = [f"# Restarting one role of a PS job (`sudo python bench/partial_restart.py --rows {args.rows} "
             f"--watch-s {args.watch_s:g}`, {time.strftime('%Y-%m-%d')})", "",
             "Paddle 2.6.2 in podman, 2 servers + 2 workers, two passes; once worker 0 trained in pass 2 one role "
             "is killed and only its container started again (no driver, no watch).", "",
             "| restarted | examples reported after the restart: worker 0 / worker 1 | passes ended after it | "
             f"states after {args.watch_s:g} s (status, exit code) | rows per server in each committed checkpoint | "
             "last lines (not heartbeats) |", "|---|---|---|---|---|---|"]
    for r in rows:
        states = ", ".join(f"{s}: {v}" for s, v in r["states"].items())
        reported = " / ".join(", ".join(f"{n:,}" for n in r["progress_after"][w]) or "none"
                              for w in ("worker-0", "worker-1"))
        last = "; ".join(f"{s}: `{line.replace('|', '/')}`" for s, line in r["last"].items())
        lines.append(f"| {r['role']} | {reported} | {r['passes_ended']} | {states} | {r['server_rows']} | {last} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--watch-s", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    def terminate(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    work = Path(tempfile.mkdtemp(prefix="partial-"))
    (work / "containers.conf").write_text(CONTAINERS_CONF.format(nofile=resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    os.environ["CONTAINERS_CONF"] = str(work / "containers.conf")
    path = compose_file(work, args.rows)
    rows = []
    try:
        for role, service in (("worker", "worker-1"), ("server", "ps-1")):
            log(f"case: {role}")
            rows.append(case(path, role, service, args.watch_s))
            log(f"  {rows[-1]}")
    finally:
        down(path)
        shutil.rmtree(work, ignore_errors=True)
    publish(render(rows, args), args.out)


if __name__ == "__main__":
    main()
