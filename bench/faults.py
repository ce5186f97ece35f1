"""The fault matrix: a local PS job (2 servers, 2 workers) hit by one fault each, run for real, against an undisturbed
run of the same data and seed.

    python bench/faults.py [--rows 1000000] [--work DIR] [--out bench/results/faults.md] [--only NAME ...]

Every run is ``python -m pipelines.ctr`` with the default synthetic data of ``--rows`` rows, two passes, and one
fault injected from outside once the run is where the fault belongs (mid-pass: the first progress line of pass 1;
mid-save: the first ``saving`` or ``uploading`` line of a server's sidecar in the run's log). Data prep and the
baseline come from the step cache after the first run, so each run costs its training. The faults:

* ``kill -9`` of a worker and of a server, mid-pass and (a server) mid-save;
* a worker stopped (``SIGSTOP``) for 30 s, and for longer than ``ps.stall_timeout_s`` (set to 30 s for that row);
* a server's PS port cut (``iptables`` DROP both ways on loopback, the connections kept) for 10 s and for 60 s;
* the checkpoint store unwritable (``chmod 000``) for 30 s from a server's save on;
* the checkpoint store on a full disk (a 4 MiB tmpfs);
* the newest checkpoint corrupt (one byte of a table file changed), then ``checkpoint.resume=latest``.

Per fault: the exit status; detected after (s: from the fault to the launcher's line about it, a restart or an
error); training again after (s: from the fault to the next progress line that advanced); the examples trained
twice (the restart line's count); the RPCs that failed for good (their gradients lost); the test AUC against the
undisturbed run's; the job's processes left once the command ended. The table is printed and written to
``--out``. Needs root (iptables, tmpfs). About 20 minutes on 2 cores with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import log, publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROGRESS = re.compile(r"^  epoch (\d+): ([\d,]+)/")
# A server's sidecar reports its save, then its upload, while they last (a small table's save is done before its
# first report: then the upload's line is the first sign of the checkpoint).
SAVING = re.compile(r"\[server \d+\] (saving|uploading):")
RESTART = re.compile(r"restart \d+ of \d+: .*at least ([\d,]+) examples to train again")


@dataclass
class Run:
    """One command's console, each line with the time it came."""

    lines: list[tuple[float, str]] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    status: Optional[int] = None

    def first(self, pattern: re.Pattern, after: float) -> Optional[tuple[float, re.Match]]:
        for at, line in self.lines:
            found = pattern.search(line)
            if at >= after and found:
                return at, found
        return None

    def advanced_after(self, after: float) -> Optional[float]:
        """When a progress line after ``after`` first showed more examples than the last one before it."""
        before = [int(m[2].replace(",", "")) + 10 ** 9 * int(m[1]) for at, line in self.lines
                  if at < after and (m := PROGRESS.search(line))]
        last = max(before) if before else -1
        for at, line in self.lines:
            m = PROGRESS.search(line)
            if at >= after and m and int(m[2].replace(",", "")) + 10 ** 9 * int(m[1]) != last:
                return at
        return None


def role_processes(marker: str) -> dict[str, int]:
    """``{"server-0": pid, "worker-1": pid, ...}`` of the PS processes whose environment holds ``marker``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if b"components.ps.role" not in cmdline:
                continue
            env = dict(item.split("=", 1) for item in (entry / "environ").read_bytes().decode(errors="replace")
                       .split("\0") if "=" in item)
        except OSError:
            continue
        if marker not in env.get("PS_BENCH_MARKER", ""):
            continue
        role = "server" if env.get("TRAINING_ROLE") == "PSERVER" else "worker"
        index = env.get("PADDLE_TRAINER_ID") if role == "worker" else str(
            env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",").index(f"{env['POD_IP']}:{env['PADDLE_PORT']}"))
        found[f"{role}-{index}"] = int(entry.name)
        if role == "server":
            found[f"port-{index}"] = int(env["PADDLE_PORT"])
    return found


def wait_for(condition: Callable[[], bool], limit_s: float, period_s: float = 0.1) -> bool:
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(period_s)
    return False


def iptables(action: str, port: int) -> None:
    for direction in ("--dport", "--sport"):
        subprocess.run(["iptables", action, "INPUT", "-i", "lo", "-p", "tcp", direction, str(port), "-j", "DROP"],
                       check=action == "-I")


class Fault:
    """Where it waits (``trigger``: a console pattern, or ``log``: a pattern of the run's log) and what it does."""

    def __init__(self, name: str, what: str, act: Callable[[dict, "Fault"], None], trigger: str = "progress",
                 overrides: tuple[str, ...] = ()):
        self.name, self.what, self.act, self.trigger, self.overrides = name, what, act, trigger, overrides
        self.injected_at: Optional[float] = None
        self.ended_at: Optional[float] = None
        self.store: Optional[Path] = None


def _kill(role: str) -> Callable[[dict, Fault], None]:
    def act(procs: dict, fault: Fault) -> None:
        fault.injected_at = time.time()
        os.kill(procs[role], signal.SIGKILL)
        fault.ended_at = fault.injected_at
    return act


def _stop(role: str, seconds: float) -> Callable[[dict, Fault], None]:
    def act(procs: dict, fault: Fault) -> None:
        fault.injected_at = time.time()
        os.kill(procs[role], signal.SIGSTOP)
        time.sleep(seconds)
        try:
            os.kill(procs[role], signal.SIGCONT)
        except ProcessLookupError:  # the launcher stopped it meanwhile
            pass
        fault.ended_at = time.time()
    return act


def _cut(server: int, seconds: float) -> Callable[[dict, Fault], None]:
    def act(procs: dict, fault: Fault) -> None:
        port = procs[f"port-{server}"]
        iptables("-I", port)
        fault.injected_at = time.time()
        try:
            time.sleep(seconds)
        finally:
            iptables("-D", port)
        fault.ended_at = time.time()
    return act


def _store_outage(seconds: float) -> Callable[[dict, Fault], None]:
    def act(procs: dict, fault: Fault) -> None:
        mode = fault.store.stat().st_mode
        fault.store.chmod(0)
        fault.injected_at = time.time()
        try:
            time.sleep(seconds)
        finally:
            fault.store.chmod(mode)
        fault.ended_at = time.time()
    return act


FAULTS = [
    Fault("undisturbed", "none", lambda procs, fault: None, trigger="none"),
    Fault("kill-worker", "`kill -9` of worker 1 mid-pass", _kill("worker-1")),
    Fault("kill-server", "`kill -9` of server 0 mid-pass", _kill("server-0")),
    Fault("kill-server-save", "`kill -9` of server 0 mid-save", _kill("server-0"), trigger="save"),
    Fault("stop-worker-30s", "worker 0 stopped (SIGSTOP) for 30 s", _stop("worker-0", 30)),
    Fault("stop-worker-stall", "worker 0 stopped for 45 s, `ps.stall_timeout_s=30`", _stop("worker-0", 45),
          overrides=("ps.stall_timeout_s=30",)),
    Fault("cut-server-10s", "server 0's port cut for 10 s (iptables DROP)", _cut(0, 10)),
    Fault("cut-server-60s", "server 0's port cut for 60 s", _cut(0, 60)),
    Fault("store-outage-30s", "checkpoint store unwritable for 30 s from a save on", _store_outage(30),
          trigger="save"),
    Fault("disk-full", "checkpoint store on a full 4 MiB disk", lambda procs, fault: None, trigger="none"),
    Fault("corrupt-latest", "newest checkpoint corrupt, then `checkpoint.resume=latest`",
          lambda procs, fault: None, trigger="none"),
]


def run_once(fault: Fault, args, work: Path, extra: tuple[str, ...] = ()) -> tuple[Run, Path, str]:
    run_dir = work / fault.name
    shutil.rmtree(run_dir, ignore_errors=True)
    store = Path(fault.store) if fault.store else run_dir / "checkpoint"
    fault.store = store
    overrides = [f"data.rows={args.rows}", "ps.epochs=2", "ps.patience=5", f"hydra.run.dir={run_dir}",
                 f"cluster.local_cache_root={work / 'cache'}", f"checkpoint.uri={store}", *fault.overrides, *extra]
    marker = f"{os.getpid()}-{fault.name}-{time.time()}"
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(ROOT), "PS_BENCH_MARKER": marker}
    run = Run(started=time.time())
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.ctr", *overrides], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def read() -> None:
        for line in proc.stdout:
            run.lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    injector = None
    if fault.trigger != "none":
        def inject() -> None:
            def ready() -> bool:
                if fault.trigger == "progress":
                    return any(PROGRESS.search(line) for _, line in run.lines)
                log_file = run_dir / "ctr.log"
                return log_file.is_file() and SAVING.search(log_file.read_text(errors="replace")) is not None
            if not wait_for(ready, 900) or proc.poll() is not None:
                return
            procs = role_processes(marker)
            if procs:
                fault.act(procs, fault)
        injector = threading.Thread(target=inject, daemon=True)
        injector.start()
    run.status = proc.wait()
    run.ended = time.time()
    reader.join()
    if injector is not None:
        injector.join(timeout=120)
    return run, run_dir, marker


def row(fault: Fault, run: Run, run_dir: Path, reference_auc: Optional[float], marker_left: int) -> dict:
    metrics_file = run_dir / "metrics.json"
    auc = json.loads(metrics_file.read_text())["auc"] if metrics_file.is_file() else None
    at = fault.injected_at
    detected = restart = None
    if at is not None:
        hit = run.first(re.compile(r"restart \d+ of|^error: "), at)
        detected = hit[0] - at if hit else None
        restart = run.first(RESTART, at)
    again = run.advanced_after(fault.ended_at or at) if at is not None else None
    errors = [line for _, line in run.lines if line.startswith("error: ")]
    # A push or pull that failed for good (after brpc's retries) is logged by Paddle's client as "request cmd_id:..
    # failed": its gradient is lost. None means every RPC of the job got through in the end.
    failed_rpcs = sum(log_file.read_text(errors="replace").count("failed, err")
                      for log_file in (run_dir / "logs").glob("worker-*.log"))
    warnings = [line for _, line in run.lines if line.strip().startswith("warning: ")]
    return {"fault": fault.what, "exit": run.status, "detected_s": detected,
            "again_s": (again - at) if again and at else None,
            "twice": int(restart[1][1].replace(",", "")) if restart else 0,
            "auc": auc, "delta": (auc - reference_auc) if auc is not None and reference_auc is not None else None,
            "wall_s": run.ended - run.started, "left": marker_left, "failed_rpcs": failed_rpcs,
            "said": (errors or warnings or [""])[0][:160]}


def processes_left(marker: str) -> int:
    """The run's PS processes still alive (a second after its command ended)."""
    time.sleep(1)
    return sum(1 for name in role_processes(marker) if not name.startswith("port-"))


def _fmt(value, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _signed(value: Optional[float]) -> str:
    return "" if value is None else f"{value:+.4f}"


def render(rows: list[dict], args) -> str:
    head = (f"## The fault matrix (`python bench/faults.py`, {time.strftime('%Y-%m-%d %H:%M')}, 2 cores)\n\n"
            f"A local job (2 servers, 2 workers) on {args.rows:,} synthetic rows, two passes, each run with one fault "
            "injected from outside (`bench/faults.py`); AUC against the undisturbed run of the same data and seed.\n\n"
            "| fault | exit | detected after (s) | training again after (s) | examples trained twice | failed RPCs | "
            "test AUC | vs undisturbed | wall (s) | PS processes left | what the run said |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['fault']} | {r['exit']} | {_fmt(r['detected_s'])} | {_fmt(r['again_s'])} | {r['twice']:,} | "
        f"{r['failed_rpcs']} | "
        f"{_fmt(r['auc'], 4)} | {_signed(r['delta'])} | {_fmt(r['wall_s'])} | {r['left']} | "
        f"{r['said'].replace('|', '/')} |\n" for r in rows)
    return head + body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ctr-faults"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "faults.md")
    parser.add_argument("--only", nargs="*", help="fault names (undisturbed always runs first)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("error: bench/faults.py needs root (iptables, a tmpfs for the full disk)")
    args.work.mkdir(parents=True, exist_ok=True)
    faults = [f for f in FAULTS if f.name == "undisturbed" or not args.only or f.name in args.only]
    rows, reference = [], None
    for fault in faults:
        log(f"{fault.name}: {fault.what}")
        mount = None
        extra: tuple[str, ...] = ()
        if fault.name == "disk-full":
            mount = args.work / "tiny-disk"
            mount.mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
            fault.store = mount / "checkpoint"
        if fault.name == "corrupt-latest":
            fault.store = _corrupted_copy(args.work)
            extra = ("checkpoint.resume=latest", "ps.epochs=3")
        try:
            run, run_dir, marker = run_once(fault, args, args.work, extra)
        finally:
            if mount is not None:
                subprocess.run(["umount", str(mount)], check=False)
        if fault.name == "corrupt-latest":
            fault.injected_at = run.started
        left = processes_left(marker)
        result = row(fault, run, run_dir, reference, left)
        if fault.name == "undisturbed":
            reference = result["auc"]
        rows.append(result)
        log(f"  exit {result['exit']}, AUC {result['auc']}, {result['wall_s']:.0f}s, left {left}; {result['said']}")
    publish(render(rows, args), args.out)


def _corrupted_copy(work: Path) -> Path:
    """The undisturbed run's store, copied, its newest checkpoint's first table file changed by one byte."""
    source = work / "undisturbed" / "checkpoint"
    target = work / "corrupt-store"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    latest = json.loads((target / "LATEST").read_text())["id"]
    table = sorted(path for path in (target / latest / "tables").rglob("*") if path.is_file())[0]
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 1
    table.write_bytes(bytes(data))
    return target


if __name__ == "__main__":
    main()
