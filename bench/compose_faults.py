"""The fault matrix of a compose job in podman: containers killed, paused and cut off the job's network, under the
driver that restarts the job whole (``containers/compose_up.py``), against an undisturbed run of the same file.

    sudo python bench/compose_faults.py [--rows 400000] [--only NAME ...] [--out bench/results/compose_faults.md]

One compose file (``python -m components.train.backends.docker_compose``, two passes, the checkout's code mounted
over the image's package, as ``bench/network.py`` does) is run once per fault by the driver, the way a user runs it.
Each fault is injected from outside once worker 0 reports progress in pass 2 (a checkpoint of pass 1 is committed;
one row in pass 1, before any):

* ``podman kill`` (SIGKILL) of a worker and of a server: the driver restarts the job from that checkpoint;
* a worker paused (``podman pause``) for longer than ``ps.stall_timeout_s`` (set to 20 s for that row): the
  ``watch`` service sees its heartbeat record stop changing and exits, the driver restarts the job;
* a worker and a server cut off the job's network (``podman network disconnect``, then ``connect`` with the same
  address) for 10 s and for 60 s: the job should carry on without a restart (the heartbeats go to the store, a
  volume, so the watch sees the roles alive; Paddle's RPCs wait ``ps.rpc_connect_timeout_ms``).

Per fault: the driver's exit status; restarts; detected after (s: from the fault to the driver's restart line);
training again after (s: from the fault, or the end of a cut, to the next worker progress line that advanced); the
examples trained twice (what the workers reported of the pass the restart threw away); the test AUC against the
undisturbed run's; the containers still running once the driver ended. Everything it creates is removed at the
end, also when it fails or is stopped. Needs root (podman). About 20 minutes on 2 cores.
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
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import log, publish  # noqa: E402
from bench.network import CONTAINERS_CONF, project_file  # noqa: E402
from bench.network import down as network_down  # noqa: E402
from components.train.backends import docker_compose as compose  # noqa: E402

PROJECT = "ctr-faultbench"
RESULTS = ROOT / "bench" / "results" / "compose_faults.md"
RUN_TIMEOUT_S = 1200
PROGRESS = re.compile(r"^(worker-\d) +\| @progress (\{.*\})$")
RESTART = re.compile(r"^\S+: restart \d+ of \d+: ")
AUC = re.compile(r"^evaluate +\| evaluation: test auc=([\d.]+)")


@dataclass
class Run:
    """The driver's output, each line with the time it came."""

    lines: list[tuple[float, str]] = field(default_factory=list)
    status: Optional[int] = None
    left: int = 0

    def progress(self) -> list[tuple[float, str, int, int]]:
        """``(when, worker, pass, examples in it)`` of every worker progress line."""
        found = []
        for when, line in list(self.lines):
            m = PROGRESS.match(line)
            if m:
                event = json.loads(m.group(2))
                if "examples" in event and "epoch" in event:
                    found.append((when, m.group(1), int(event["epoch"]), int(event["examples"])))
        return found

    def first(self, pattern: re.Pattern, after: float = 0.0) -> Optional[tuple[float, re.Match]]:
        for when, line in list(self.lines):
            m = pattern.match(line)
            if m and when >= after:
                return when, m
        return None


@dataclass
class Fault:
    name: str
    what: str
    act: Optional[Callable[["Fault"], None]]  # run once the trigger came; sets injected_at and ended_at
    overrides: tuple[str, ...] = ()
    in_pass: int = 2  # injected once worker 0 reports progress in this pass
    injected_at: float = 0.0
    ended_at: float = 0.0


def podman(*args: str, check: bool = True) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode:
        raise RuntimeError(f"podman {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def container(service: str) -> str:
    return f"{PROJECT}_{service}_1"  # podman-compose 1.0's name


def _kill(service: str) -> Callable[[Fault], None]:
    def act(fault: Fault) -> None:
        fault.injected_at = fault.ended_at = time.time()
        podman("kill", container(service))
    return act


def _pause(service: str, seconds: float) -> Callable[[Fault], None]:
    def act(fault: Fault) -> None:
        podman("pause", container(service))
        fault.injected_at = time.time()
        time.sleep(seconds)
        podman("unpause", container(service), check=False)  # the driver may have stopped it meanwhile
        fault.ended_at = time.time()
    return act


def _cut(service: str, seconds: float) -> Callable[[Fault], None]:
    """Off the job's network and back on it with the same address: peers dial addresses they resolved once."""
    def act(fault: Fault) -> None:
        network = f"{PROJECT}_{compose.JOB_NETWORK}"
        name = container(service)
        ip = podman("inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}', name)
        podman("network", "disconnect", network, name)
        fault.injected_at = time.time()
        try:
            time.sleep(seconds)
        finally:
            podman("network", "connect", "--ip", ip, "--alias", service, network, name)
        fault.ended_at = time.time()
    return act


FAULTS = [
    Fault("none", "none (the reference)", None),
    Fault("kill-worker", "`podman kill` of worker 1 mid-pass", _kill("worker-1")),
    Fault("kill-worker-first-pass", "`podman kill` of worker 1 in pass 1 (no checkpoint yet)", _kill("worker-1"),
          in_pass=1),
    Fault("kill-server", "`podman kill` of server 0 mid-pass", _kill("ps-0")),
    Fault("pause-worker", "worker 1 paused 40 s, `ps.stall_timeout_s=20`", _pause("worker-1", 40),
          ("ps.stall_timeout_s=20",)),
    Fault("cut-worker-10s", "worker 1 off the network for 10 s", _cut("worker-1", 10)),
    Fault("cut-worker-60s", "worker 1 off the network for 60 s", _cut("worker-1", 60)),
    Fault("cut-server-10s", "server 1 off the network for 10 s", _cut("ps-1", 10)),
    Fault("cut-server-60s", "server 1 off the network for 60 s", _cut("ps-1", 60)),
]


def compose_file(work: Path, rows: int, overrides: tuple[str, ...]) -> Path:
    return project_file(work / f"compose-{abs(hash(overrides))}.yaml", PROJECT,
                        [f"data.rows={rows}", "ps.epochs=2", *overrides])


def down(path: Path) -> None:
    network_down(path, PROJECT)


def run_once(fault: Fault, path: Path) -> Run:
    run = Run()
    driver = subprocess.Popen([sys.executable, str(ROOT / "containers" / "compose_up.py"), str(path),
                               "--timeout", str(RUN_TIMEOUT_S)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)

    def read() -> None:
        for line in driver.stdout:
            run.lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if fault.act is not None:
            while driver.poll() is None and not any(w == "worker-0" and p >= fault.in_pass
                                                    for _, w, p, n in run.progress()):
                time.sleep(0.2)
            if driver.poll() is None:
                fault.act(fault)
        run.status = driver.wait(RUN_TIMEOUT_S + 60)
    finally:
        if driver.poll() is None:
            driver.terminate()
            driver.wait(60)
        reader.join(10)
        run.left = len(podman("ps", "-q", "--filter", f"name={PROJECT}_", check=False).split())
    return run


def row(fault: Fault, run: Run, reference_auc: Optional[float]) -> dict:
    every = [when for when, line in run.lines if RESTART.match(line)]
    # A restart before the fault is the start's own (a role that failed as the job came up), not the fault's.
    restarts = [when for when in every if when >= fault.injected_at]
    before = f" (+{len(every) - len(restarts)} before the fault)" if len(every) > len(restarts) else ""
    auc = run.first(AUC)
    out = {"fault": fault.what, "exit": run.status, "restarts": f"{len(restarts)}{before}", "detected": None,
           "again": None, "twice": 0, "auc": float(auc[1].group(1)) if auc else None, "reference": reference_auc,
           "left": run.left}
    if fault.act is None:
        return out
    if restarts:
        out["detected"] = restarts[0] - fault.injected_at
        thrown = [(w, p, n) for when, w, p, n in run.progress() if when < restarts[0] and p >= fault.in_pass]
        last = {w: n for w, _, n in thrown}  # the pass the restart threw away: trained again
        out["twice"] = sum(last.values())
    resumed = max(restarts[0] if restarts else 0.0, fault.ended_at)
    seen = {w: (p, n) for when, w, p, n in run.progress() if when <= resumed}
    for when, worker, epoch, examples in run.progress():
        if when > resumed and (restarts or (epoch, examples) > seen.get(worker, (0, 0))):
            out["again"] = when - fault.injected_at
            break
    return out


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(rows: list[dict], args, minutes: float) -> str:
    reference = next((r["auc"] for r in rows if r["fault"].startswith("none")), None)
    lines = [f"# Faults in a compose job (`sudo python bench/compose_faults.py --rows {args.rows}`, "
             f"{time.strftime('%Y-%m-%d')}, {minutes:.0f} min)", "",
             "Podman, 2 servers + 2 workers in containers, two passes of the default synthetic data, each fault once "
             "worker 0 reports progress in pass 2; the driver `containers/compose_up.py` restarts the job whole "
             "(`cluster.max_restarts`).", "",
             "| fault | exit | restarts | detected after (s) | training again after (s) | examples trained twice "
             "| test AUC | vs undisturbed | containers left |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        delta = (f"{r['auc'] - reference:+.4f}" if r["auc"] is not None and reference is not None
                 and not r["fault"].startswith("none") else "-")
        lines.append(f"| {r['fault']} | {r['exit']} | {r['restarts']} | {_fmt(r['detected'])} | {_fmt(r['again'])} | "
                     f"{r['twice']:,} | {_fmt(r['auc'], 4)} | {delta} | {r['left']} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--only", nargs="*", help="fault names (the reference always runs)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    def terminate(signum, frame):  # run the teardown in the finally block
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    work = Path(tempfile.mkdtemp(prefix="faultbench-"))
    (work / "containers.conf").write_text(CONTAINERS_CONF.format(nofile=resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    os.environ["CONTAINERS_CONF"] = str(work / "containers.conf")
    faults = [f for f in FAULTS if f.act is None or not args.only or f.name in args.only]
    rows, started, path = [], time.time(), None
    try:
        for fault in faults:
            path = compose_file(work, args.rows, fault.overrides)
            down(path)
            log(f"{fault.name}: {fault.what}")
            run = run_once(fault, path)
            (work / f"{fault.name}.log").write_text("\n".join(line for _, line in run.lines) + "\n")
            rows.append(row(fault, run, rows[0]["auc"] if rows else None))
            log(f"  {rows[-1]}")
            down(path)
    finally:
        if path is not None:
            down(path)
        logs = Path(tempfile.gettempdir()) / "compose_faults-logs"  # each run's driver output, to read after
        shutil.rmtree(logs, ignore_errors=True)
        shutil.copytree(work, logs, ignore=shutil.ignore_patterns("*.conf", "*.yaml", "*.json"))
        shutil.rmtree(work, ignore_errors=True)
        log(f"the driver's output of each run: {logs}")
    publish(render(rows, args, (time.time() - started) / 60), args.out)


if __name__ == "__main__":
    main()
