"""Throughput of our PS train step vs. hand-written Paddle fleet loops, side by side, in one run.

    python bench/throughput.py [--rows N] [--quick] [--layouts 1x1,2x2] [--out bench/results/throughput.md]

What runs (same synthetic data, same DNN: embedding dim 9, hidden [256, 128], batch 256, threads 1, async PS,
adagrad sparse table, Adam on dense; one epoch):

* **ours** -- ``components.train.step.launch_ps_job``: our role processes, ``QueueDataset`` +
  ``train_from_dataset``, progress handler, global AUC, checkpoint + export at the end.
* **hand-written feed** -- ``bench/handwritten_fleet.py --loop feed``: a self-contained fleet script that parses
  the shard files in Python and calls ``exe.run(feed=...)`` per batch (the seed article's way). It is slow, so it
  stops after ``--feed-seconds`` and its rate is extrapolated from the batches it did.
* **hand-written dataset** -- the same script with ``--loop dataset`` (``QueueDataset`` + ``train_from_dataset``).

Each for every layout (default 1 server/1 worker and 2 servers/2 workers). The hand-written processes get
the environment ours get (``components.ps.contract.role_env`` over a fresh ``local_layout``; no
``paddle.distributed.launch``) except ``FLAGS_LAUNCH_BARRIER``, so they keep Paddle's own wait for the servers, each in its own process group, killed (SIGTERM, then SIGKILL) when the job ends
or fails; leftovers are checked for with ``pgrep`` after every job.

Measures:

* **examples/s** = examples trained by all workers / the training loop's seconds. Hand-written: each worker
  reports its loop start/end (``time.time()`` around the loop, so startup and teardown are excluded) and its
  example count; the job's seconds are the longest worker's. Ours: the global example count and the epoch
  seconds of the ``@epoch`` event in ``JobResult.epochs`` (worker 0's loop; the workers start together after a
  barrier and hold equally many rows).
* **to 1st batch** = seconds from the job's command start (just before the first process is spawned, or just
  before ``launch_ps_job`` is called) to the training loop's start on the first worker. Hand-written: the
  timestamp the worker prints (feed: just before its first ``exe.run``; dataset: just before
  ``train_from_dataset``). Ours: derived from the first ``@progress`` line each worker sends:
  ``loop start = time the line arrived - examples / examples_per_s`` (both computed by the worker against its
  loop start); if no progress line came, from the ``@epoch`` line: arrival - epoch seconds.
* **job wall** = command start to the last process gone (includes startup, the end barriers, and for ours the
  checkpoint save + export).
* **ours / best** = ours' examples/s divided by the best hand-written examples/s of the layout.

Before every job the script waits (polling every 10 s, up to 10 minutes) until no other PS job
(``components.ps.role``, ``paddle.distributed.launch``, the hand-written script) is running on the machine.
The table is printed and written to ``bench/results/throughput.md``. On the 2-core dev machine the default run
(400k rows) takes about 3 minutes, ``--quick`` (60k rows, 6 s feed cap) under 2, plus any wait for other jobs.
The generated data is cached in ``--work`` (default ``$TMPDIR/paddle-ps-bench``, ~130 MB for 400k rows).
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
import tempfile
import threading
import time
import uuid
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import log, publish  # noqa: E402
from components.config import from_dict  # noqa: E402
from components.data_prep.prepare import prepare_synthetic  # noqa: E402
from components.ps.contract import Role, role_env  # noqa: E402
from components.train.backends.local import local_layout  # noqa: E402
from components.train.step import launch_ps_job  # noqa: E402

STEPS = {"ours": "ours", "feed": "hand-written feed", "dataset": "hand-written dataset"}
HANDWRITTEN = ROOT / "bench" / "handwritten_fleet.py"
RESULTS = ROOT / "bench" / "results" / "throughput.md"
BUSY_PATTERNS = ("components.ps.role", "paddle.distributed.launch", "handwritten_fleet.py")

EMB_DIM, HIDDEN, BATCH, THREADS, VOCAB = 9, [256, 128], 256, 1, 1 << 20
JOB_TIMEOUT_S = 600.0
END_GRACE_S = 30.0
PROGRESS_RE = re.compile(r"\[worker (\d+)\] epoch \d+ \| ([\d,]+) examples \| ([\d,]+) ex/s")
EPOCH_RE = re.compile(r"== epoch \d+ done")


# -- machine hygiene -------------------------------------------------------------------------------------
def busy_processes() -> list[str]:
    found = []
    for pattern in BUSY_PATTERNS:
        out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
        found += [line for line in out.splitlines() if line.strip()]
    return found


def wait_until_quiet(limit_s: float = 600.0, poll_s: float = 10.0) -> bool:
    """Wait until no PS job runs on the machine; False if it stayed busy for ``limit_s``."""
    deadline = time.time() + limit_s
    busy = busy_processes()
    if busy:
        log(f"machine busy ({len(busy)} PS processes of other jobs); waiting up to {limit_s:.0f}s")
    while busy:
        if time.time() > deadline:
            log("still busy: measuring anyway, numbers may be polluted")
            return False
        time.sleep(poll_s)
        busy = busy_processes()
    return True


class BusyMonitor:
    """Samples, every 2 s while a job runs, whether PS processes other than this job's own are running."""

    def __init__(self, own_marker: str):
        self.own_marker, self.seen, self._stop = own_marker, set(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(2.0):
            self.seen.update(line for line in busy_processes() if self.own_marker not in line)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def leftovers(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def kill_group(popen: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- data ------------------------------------------------------------------------------------------------
def dataset(root: Path, rows: int) -> tuple[Path, dict]:
    """2 train shards: 1 worker reads both, 2 workers one each (the same rows either way). Cached by size."""
    data_dir = root / f"data-{rows}"
    stats_path = data_dir / "stats.json"
    if stats_path.exists():
        return data_dir, json.loads(stats_path.read_text())
    log(f"generating {rows:,} synthetic rows into {data_dir}")
    stats = prepare_synthetic(data_dir, rows=rows, test_fraction=0.01, num_shards=2, vocab_size=VOCAB, seed=0)
    return data_dir, stats


# -- ours ------------------------------------------------------------------------------------------------
class OursEcho:
    """Receives the launcher's echo lines; notes when each worker's loop started (see module doc)."""

    def __init__(self):
        self.loop_starts: dict[int, float] = {}
        self.epoch_arrival: float | None = None
        self.tail: deque = deque(maxlen=20)

    def __call__(self, line: str) -> None:
        now = time.time()
        self.tail.append(line)
        m = PROGRESS_RE.search(line)
        if m:
            worker, examples, rate = int(m[1]), int(m[2].replace(",", "")), int(m[3].replace(",", ""))
            if examples > 0 and rate > 0 and worker not in self.loop_starts:
                self.loop_starts[worker] = now - examples / rate
        elif EPOCH_RE.search(line) and self.epoch_arrival is None:
            self.epoch_arrival = now


def run_ours(servers: int, workers: int, data_dir: Path, work: Path) -> dict:
    cfg = from_dict({
        "model": {"name": "dnn", "hidden": HIDDEN},
        "table": {"embedding_dim": EMB_DIM, "vocab_size": VOCAB},
        "ps": {"mode": "async", "servers": servers, "workers": workers, "epochs": 1, "threads": THREADS,
               "batch_size": BATCH, "progress_period_s": 2},
        "checkpoint": {"uri": str(work / "ckpt")},
        "run_dir": str(work),
    })
    echo = OursEcho()
    started = time.time()
    result = launch_ps_job(cfg, data_dir, work / "logs", echo=echo)
    wall = time.time() - started
    left = leftovers(str(work))
    if left:
        raise RuntimeError(f"ours left processes behind: {left}")
    epoch = result.epochs[0]
    if echo.loop_starts:
        first, how = min(echo.loop_starts.values()), "progress"
    else:
        first, how = echo.epoch_arrival - epoch["seconds"], "epoch"
    return {"examples": epoch["examples"], "loop_s": epoch["seconds"],
            "ex_per_s": epoch["examples"] / epoch["seconds"], "first_batch_s": first - started, "wall_s": wall,
            "note": f"1st batch from @{how}; AUC {epoch['auc']:.3f}"}


# -- hand-written ----------------------------------------------------------------------------------------
def run_handwritten(servers: int, workers: int, loop: str, data_dir: Path, work: Path, feed_seconds: float) -> dict:
    job_id = f"hwbench-{uuid.uuid4().hex[:10]}"
    layout = local_layout(servers, workers, "127.0.0.1", job_id)
    work.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(HANDWRITTEN), "--data", str(data_dir), "--loop", loop,
               "--batch-size", str(BATCH), "--emb-dim", str(EMB_DIM), "--hidden", *map(str, HIDDEN),
               "--vocab", str(VOCAB), "--threads", str(THREADS)]
    if loop == "feed":
        command += ["--max-seconds", str(feed_seconds)]
    procs: list[tuple[str, subprocess.Popen, Path]] = []
    started = time.time()
    try:
        for role, count in ((Role.SERVER, servers), (Role.WORKER, workers)):
            for i in range(count):
                name = f"{role.value}-{i}"
                log_path = work / f"{name}.log"
                env = {**os.environ, **role_env(layout, role, i), "PYTHONUNBUFFERED": "1",
                       "GLOG_minloglevel": os.environ.get("GLOG_minloglevel", "1")}
                # A hand-written script relies on Paddle's own wait for the servers (ours polls them itself).
                env.pop("FLAGS_LAUNCH_BARRIER", None)
                with open(log_path, "w") as out:
                    popen = subprocess.Popen(command, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
                procs.append((name, popen, log_path))
        _supervise(procs, started)
        wall = time.time() - started
    finally:
        for _, popen, _ in procs:
            if popen.poll() is None:
                kill_group(popen, signal.SIGTERM)
        deadline = time.time() + 5
        for _, popen, _ in procs:
            try:
                popen.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
            kill_group(popen, signal.SIGKILL)  # Paddle may leave helpers in the group
            popen.wait()
    left = [line for line in leftovers(str(HANDWRITTEN)) if str(data_dir) in line]
    if left:
        raise RuntimeError(f"hand-written job left processes behind: {left}")

    reports = []
    for name, _, log_path in procs:
        for line in log_path.read_text().splitlines():
            if line.startswith("@bench "):
                reports.append(json.loads(line[len("@bench "):]))
    if len(reports) != workers:
        raise RuntimeError(f"expected {workers} @bench lines, got {len(reports)} (logs in {work})")
    examples = sum(r["examples"] for r in reports)
    loop_s = max(r["loop_end"] - r["loop_start"] for r in reports)
    row = {"examples": examples, "loop_s": loop_s, "ex_per_s": examples / loop_s,
           "first_batch_s": min(r["first_batch"] for r in reports) - started, "wall_s": wall}
    if loop == "feed":
        rows = sum(r["rows"] for r in reports)
        exe_share = sum(r["exe_seconds"] for r in reports) / sum(r["loop_end"] - r["loop_start"] for r in reports)
        capped = any(r["capped"] for r in reports)
        row["note"] = (f"{'capped: ' if capped else ''}{examples:,} of {rows:,} rows in {loop_s:.1f}s"
                       f"{', rate extrapolated' if capped else ''}; {exe_share:.0%} of loop in exe.run")
    else:
        row["note"] = ""
    return row


def _supervise(procs, started: float) -> None:
    workers_done_at = None
    while True:
        codes = [(name, p.poll(), path) for name, p, path in procs]
        for name, code, path in codes:
            if code not in (None, 0):
                raise RuntimeError(f"{name} exited with {code}; last lines of {path}:\n" + _tail(path))
        if all(code == 0 for _, code, _ in codes):
            return
        if workers_done_at is None and all(code == 0 for name, code, _ in codes if name.startswith("worker")):
            workers_done_at = time.time()
        if workers_done_at and time.time() - workers_done_at > END_GRACE_S:
            stuck = next((n, path) for n, c, path in codes if c is None)
            raise RuntimeError(f"{stuck[0]} did not exit {END_GRACE_S:.0f}s after the workers:\n" + _tail(stuck[1]))
        if time.time() - started > JOB_TIMEOUT_S:
            raise RuntimeError(f"hand-written job exceeded {JOB_TIMEOUT_S:.0f}s")
        time.sleep(0.2)


def _tail(path: Path, n: int = 15) -> str:
    return "\n".join("    " + line for line in path.read_text(errors="replace").splitlines()[-n:])


# -- report ----------------------------------------------------------------------------------------------
def render(results: list[dict], meta: dict) -> str:
    lines = [
        "# PS train-step throughput: ours vs. hand-written fleet loops",
        "",
        f"{meta['when']} | Paddle {meta['paddle']} (CPU) | {meta['cpus']} CPU cores | "
        f"{meta['train_rows']:,} train rows (synthetic, 13 dense + 26 sparse slots) | DNN emb {EMB_DIM}, "
        f"hidden {HIDDEN}, batch {BATCH}, threads {THREADS}, async, 1 epoch"
        f"{' | --quick' if meta['quick'] else ''}",
        "",
        "| layout | train step | examples/s | loop s | examples | to 1st batch s | job wall s | ours / best | notes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for layout in dict.fromkeys(r["layout"] for r in results):
        rows = [r for r in results if r["layout"] == layout]
        ours = next((r for r in rows if r["step"] == "ours"), None)
        hand = [r for r in rows if r["step"] != "ours"]
        best = max(hand, key=lambda r: r["ex_per_s"]) if hand else None
        for r in rows:
            ratio, step = "", r["step"] + (" (*)" if r["polluted"] else "")
            if r is ours and best:
                ratio = f"**{ours['ex_per_s'] / best['ex_per_s']:.2f}** (vs {best['step']})"
            lines.append(f"| {layout} | {step} | {r['ex_per_s']:,.0f} | {r['loop_s']:.1f} | {r['examples']:,} "
                         f"| {r['first_batch_s']:.1f} | {r['wall_s']:.1f} | {ratio} | {r['note']} |")
    lines += [
        "",
        "examples/s = examples trained by all workers / longest worker's training-loop seconds (startup and "
        "teardown excluded). to 1st batch = command start -> first worker's training-loop start. "
        "Method: docstring of `bench/throughput.py`.",
    ]
    if any(r["polluted"] for r in results):
        lines += ["", "(*) other PS jobs were running on this machine during that measurement (after retries): "
                      "its numbers are low."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description="Throughput: our PS train step vs. hand-written fleet loops.")
    ap.add_argument("--rows", type=int, help="synthetic rows (default 400000, --quick 60000)")
    ap.add_argument("--quick", action="store_true", help="small data and a short exe.run loop (~2 minutes)")
    ap.add_argument("--layouts", default="1x1,2x2", help="SERVERSxWORKERS, comma separated")
    ap.add_argument("--feed-seconds", type=float, help="cap on the exe.run(feed) loop (default 20, --quick 6)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "paddle-ps-bench",
                    help="data cache and job scratch space")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--steps", default="ours,feed,dataset", help="which train steps to run (comma separated)")
    ap.add_argument("--retries", type=int, default=1,
                    help="re-measure a job this often when other PS jobs ran during it")
    ap.add_argument("--keep", action="store_true", help="keep job logs and checkpoints")
    args = ap.parse_args()
    rows = args.rows or (60_000 if args.quick else 400_000)
    feed_seconds = args.feed_seconds or (6.0 if args.quick else 20.0)
    layouts = [tuple(int(n) for n in spec.lower().split("x")) for spec in args.layouts.split(",")]

    def terminate(signum, frame):  # run the cleanup in the finally blocks
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    args.work.mkdir(parents=True, exist_ok=True)
    data_dir, stats = dataset(args.work, rows)
    run_root = Path(tempfile.mkdtemp(prefix="run-", dir=args.work))
    steps = [STEPS[name] for name in args.steps.split(",")]
    results = []
    try:
        for servers, workers in layouts:
            layout = f"{servers}s/{workers}w"
            for step in steps:
                for attempt in range(args.retries + 1):
                    wait_until_quiet()
                    work = run_root / f"{servers}x{workers}-{step.replace(' ', '-')}-{attempt}"
                    log(f"{layout}: {step} ...")
                    with BusyMonitor(str(work) if step == "ours" else str(HANDWRITTEN)) as monitor:
                        if step == "ours":
                            row = run_ours(servers, workers, data_dir, work)
                        else:
                            row = run_handwritten(servers, workers, step.split()[-1], data_dir, work, feed_seconds)
                    row.update(layout=layout, step=step, polluted=bool(monitor.seen))
                    log(f"{layout}: {step}: {row['ex_per_s']:,.0f} examples/s over {row['loop_s']:.1f}s, "
                        f"first batch at {row['first_batch_s']:.1f}s, wall {row['wall_s']:.1f}s"
                        + (f"; {len(monitor.seen)} processes of other PS jobs ran meanwhile" if monitor.seen else ""))
                    if not monitor.seen:
                        break
                    if attempt < args.retries:
                        log("measuring it again")
                results.append(row)
    finally:
        if not args.keep:
            shutil.rmtree(run_root, ignore_errors=True)
        else:
            log(f"logs kept in {run_root}")
    from importlib.metadata import version

    table = render(results, {"when": time.strftime("%Y-%m-%d %H:%M"), "paddle": version("paddlepaddle"),
                             "cpus": os.cpu_count(), "train_rows": stats["rows"]["train"], "quick": args.quick,
                             })
    publish(table, args.out)


if __name__ == "__main__":
    main()
