"""Data prep on raw Criteo-format TSV: our prep against the implementation before it and a naive one-loop Python
conversion, side by side in one run; peak memory as the input grows; and the whole pipeline at growing sizes.

    python bench/prep.py [--quick] [--work DIR] [--out bench/results/prep.md]

Input: raw Criteo TSV written by ``components.data_prep.synthetic.write_raw_tsv`` (the default synthetic hidden
model: 13 heavy-tailed counts, 26 Zipf-skewed categoricals, FM interactions, a known oracle AUC), cached in --work.

What runs on the largest input, each in a fresh process that reports its wall time (peak RSS of it and its children
sampled from here). The largest, as a real single file would be: a fixed second or so of start-up (imports, the
pool's processes, spawned: numpy's and pyarrow's threads rule out fork) and the serial merge weigh less on it:

* **naive loop** -- one Python loop over the lines: split, label check, ``log1p`` per count, ``zlib.crc32`` per
  categorical, one MultiSlot text line, written round-robin to the shards; no validation beyond the label;
* **before** -- the data prep this project had before the vectorised one (``components/data_prep`` at commit
  ``BEFORE``, read from git): a record per line through Python readers, hashing per chunk, lines joined in Python;
* **ours, N processes** -- ``prepare_files`` with a pool of N processes (the dataset is identical for any N).

Then ours (2 processes) at the growing sizes (peak RSS must not grow with the input), and the pipeline
(``python -m pipelines.ctr data=criteo data.uri=<file> ps.epochs=1``, 2 servers + 2 workers) at each size: its
data-prep stage (from resolve-config's end to merge-data's end, kfp.local's task log), the train step, the
servers' peak RSS, the checkpoint's size and the test AUC against the oracle.

``--quick`` uses 60k / 250k rows and skips the pipeline runs. The table is printed and written to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import PeakMemory, log, publish  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "prep.md"
BEFORE = "0ee324b"  # the last commit with the record-by-record data prep
BEFORE_FILES = ("components/__init__.py", "components/data_prep/__init__.py", "components/data_prep/hashing.py",
                "components/data_prep/multislot.py", "components/data_prep/readers.py",
                "components/data_prep/prepare.py", "components/data_prep/synthetic.py",
                "components/evaluate/__init__.py", "components/evaluate/metrics.py")
SETTINGS = dict(test_fraction=0.1, num_shards=2, vocab_size=1 << 20, seed=0, max_malformed_fraction=0.01)
MIB = 1 << 20


# -- the measured programs: each runs in a process of its own (python bench/prep.py --measure ...) ----------------
def naive(source: str, out: str) -> int:
    """The conversion written as a user would first write it: one loop, a line at a time."""
    import math
    import zlib

    Path(out).mkdir(parents=True)
    shards = [open(Path(out) / f"part-{i}.txt", "w") for i in range(SETTINGS["num_shards"])]
    rows = 0
    with open(source) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 40 or fields[0] not in ("0", "1"):
                continue
            dense = " ".join(f"{min(math.log1p(max(float(v), 0.0)) / 16, 1.0):.6g}" if v else "0"
                             for v in fields[1:14])
            sparse = " ".join(f"1 {zlib.crc32(f'C{i}:{v}'.encode()) % SETTINGS['vocab_size']}"
                              for i, v in enumerate(fields[14:], 1))
            shards[rows % len(shards)].write(f"1 {fields[0]} 13 {dense} {sparse}\n")
            rows += 1
    for shard in shards:
        shard.close()
    return rows


def before(source: str, out: str) -> int:
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]  # the old tree (PYTHONPATH) wins
    from components.data_prep.prepare import prepare_files

    stats = prepare_files(out, uri=source, fmt="raw", **SETTINGS)
    return stats["rows"]["train"] + stats["rows"]["test"]


def ours(source: str, out: str, processes: int) -> int:
    from components.data_prep.prepare import prepare_files

    stats = prepare_files(out, uri=source, fmt="raw", processes=processes, **SETTINGS)
    return stats["rows"]["train"] + stats["rows"]["test"]


def measure(kind: str, source: str, out: str, processes: int) -> None:
    started = time.perf_counter()
    rows = {"naive": lambda: naive(source, out), "before": lambda: before(source, out),
            "ours": lambda: ours(source, out, processes)}[kind]()
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - started}))


def run_measured(kind: str, source: Path, work: Path, processes: int = 1) -> dict:
    out = work / f"out-{kind}-{processes}"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(work / "before") if kind == "before" else str(ROOT)}
    child = subprocess.Popen([sys.executable, __file__, "--measure", kind, str(source), str(out), str(processes)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=work)
    with PeakMemory(child.pid, period_s=0.05) as memory:
        stdout, stderr = child.communicate()
    if child.returncode:
        raise RuntimeError(f"{kind} failed:\n{stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    result = json.loads(stdout.strip().splitlines()[-1])
    return {**result, "peak_rss": max(memory.peaks.values()), "rows_per_s": result["rows"] / result["seconds"]}


def checkout_before(work: Path) -> None:
    """The data prep of commit BEFORE, as a package tree of its own."""
    for rel in BEFORE_FILES:
        text = subprocess.run(["git", "show", f"{BEFORE}:{rel}"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
        target = work / "before" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def input_file(work: Path, rows: int) -> tuple[Path, dict]:
    from components.data_prep.synthetic import write_raw_tsv

    path = work / f"criteo-{rows}.tsv"
    oracle_path = path.with_suffix(".oracle.json")
    if not oracle_path.exists():
        log(f"writing {rows:,} rows of raw TSV to {path}")
        oracle_path.write_text(json.dumps(write_raw_tsv(str(path), rows, seed=11)))
    return path, json.loads(oracle_path.read_text())


# -- the pipeline at growing sizes --------------------------------------------------------------------------------
_TASK_END = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) - INFO - Task .*'([\w-]+)'.* finished with status")


def pipeline_run(source: Path, oracle: dict, work: Path) -> dict:
    run_dir = work / f"pipeline-{source.stem}"
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipelines.ctr", "data=criteo", f"data.uri={source}",
                           "ps.epochs=1", f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"pipeline on {source} failed:\n{done.stderr[-3000:]}")
    ends = {}
    for line in (run_dir / "ctr.log").read_text().splitlines():  # the run's log file holds kfp.local's task log
        found = _TASK_END.match(re.sub(r"\x1b\[[0-9;]*m", "", line))
        if found:
            h, m, s, task = found.groups()
            ends[task] = int(h) * 3600 + int(m) * 60 + float(s)
    summary = json.loads(next((run_dir / "kfp").rglob("train/checkpoint")).read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    checkpoint = run_dir / "checkpoint" / summary["id"]
    return {"prep_s": ends["merge-data"] - ends["resolve-config"], "train_s": summary["seconds"], "wall_s": wall,
            "server_rss_gib": max(summary.get("server_peak_rss_gib") or [0]),
            "checkpoint_mb": sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file()) / MIB,
            "auc": metrics["auc"], "auc_ratio": metrics["auc"] / oracle["auc"], "rows": summary["examples"]}


# -- report ---------------------------------------------------------------------------------------------------------
def render(conversion: list[dict], memory: list[dict], pipeline: list[dict], meta: dict) -> str:
    naive_rate = next(r["rows_per_s"] for r in conversion if r["name"] == "naive loop")
    one = next(r["rows_per_s"] for r in conversion if r["name"] == "ours, 1 process")
    lines = [f"# Data prep on raw Criteo TSV ({meta['when']}, {meta['cpus']} cores, pyarrow {meta['pyarrow']})", "",
             f"`python bench/prep.py{' --quick' if meta['quick'] else ''}`; input: {meta['rows']:,} rows, "
             f"{meta['mb']:.0f} MB (`write_raw_tsv`, seed 11). Method: the docstring of `bench/prep.py`.", "",
             "| conversion | rows/s | rows/s per process | x naive loop | x ours, 1 process | peak RSS (MiB) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in conversion:
        lines.append(f"| {r['name']} | {r['rows_per_s']:,.0f} | {r['rows_per_s'] / r['processes']:,.0f} | "
                     f"**{r['rows_per_s'] / naive_rate:.2f}** | {r['rows_per_s'] / one:.2f} | "
                     f"{r['peak_rss'] / MIB:.0f} |")
    lines += ["", "Peak memory of ours (2 processes; the largest process) as the input grows:", "",
              "| rows | MB | seconds | rows/s | peak RSS (MiB) |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {m['rows']:,} | {m['mb']:.0f} | {m['seconds']:.1f} | {m['rows_per_s']:,.0f} | "
              f"{m['peak_rss'] / MIB:.0f} |" for m in memory]
    if pipeline:
        lines += ["", "The pipeline (`python -m pipelines.ctr data=criteo data.uri=... ps.epochs=1`, 2 servers + 2 "
                  "workers, local):", "",
                  "| rows | data-prep stage (s) | train step (s) | examples/s | peak server RSS (GiB) "
                  "| checkpoint (MB) "
                  "| test AUC / oracle |", "|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {p['input_rows']:,} | {p['prep_s']:.1f} | {p['train_s']:.1f} | {p['rows'] / p['train_s']:,.0f} | "
                  f"{p['server_rss_gib']:.2f} | {p['checkpoint_mb']:.0f} | {p['auc_ratio']:.3f} |" for p in pipeline]
        if len(pipeline) > 1:
            first, last = pipeline[0], pipeline[-1]
            grow = last["input_rows"] / first["input_rows"]
            lines += ["", f"From {first['input_rows']:,} to {last['input_rows']:,} rows ({grow:.0f}x): data prep "
                      f"{last['prep_s'] / first['prep_s']:.1f}x, training {last['train_s'] / first['train_s']:.1f}x, "
                      f"server RSS {last['server_rss_gib'] / first['server_rss_gib']:.1f}x, checkpoint "
                      f"{last['checkpoint_mb'] / first['checkpoint_mb']:.1f}x."]
    return "\n".join(lines) + "\n"


def main() -> None:
    if sys.argv[1:2] == ["--measure"]:
        kind, source, out, processes = sys.argv[2:6]
        measure(kind, source, out, int(processes))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60k / 250k rows, no pipeline runs (~2 minutes)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-prep")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import pyarrow

    sizes = [60_000, 250_000] if args.quick else [250_000, 1_000_000, 4_000_000]
    args.work.mkdir(parents=True, exist_ok=True)
    checkout_before(args.work)
    compared = sizes[-1]
    source, _ = input_file(args.work, compared)
    conversion = []
    for name, kind, processes in (("naive loop", "naive", 1), ("before (record by record)", "before", 1),
                                  ("ours, 1 process", "ours", 1), ("ours, 2 processes", "ours", 2)):
        log(f"{name} on {compared:,} rows")
        conversion.append({"name": name, "processes": processes, **run_measured(kind, source, args.work, processes)})
        log(f"  {conversion[-1]['rows_per_s']:,.0f} rows/s, peak {conversion[-1]['peak_rss'] / MIB:.0f} MiB")
    memory, pipeline = [], []
    for rows in sizes:
        path, oracle = input_file(args.work, rows)
        mb = path.stat().st_size / 1e6
        log(f"ours, 2 processes, on {rows:,} rows")
        memory.append({"rows": rows, "mb": mb, **run_measured("ours", path, args.work, 2)})
        if not args.quick:
            log(f"pipeline on {rows:,} rows")
            pipeline.append({"input_rows": rows, **pipeline_run(path, oracle, args.work)})
    meta = {"when": datetime.now().strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "quick": args.quick,
            "pyarrow": pyarrow.__version__, "rows": compared, "mb": source.stat().st_size / 1e6}
    table = render(conversion, memory, pipeline, meta)
    publish(table, args.out)


if __name__ == "__main__":
    main()
