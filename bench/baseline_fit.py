"""The baseline's fit, before and after its solver changed: seconds, the L2 it chose and the test AUC, side by side.

    python bench/baseline_fit.py [--rows 1000000] [--repeats 3] [--before COMMIT] [--work DIR]
                                 [--out bench/results/baseline_fit.md]

Input: ``--rows`` rows of raw Criteo TSV from the Criteo-like generator with the long tail of table_scale.py's
``small`` variant (``bench/table_scale.py``: column 3 takes a value seen once with probability 0.6), prepared with
the ``data=criteo`` defaults (test and validation fractions 0.1, seed 0) at two table sizes: ids hashed into the
default ``table.vocab_size=2^20``, and not hashed down (``2^40``, as table_scale.py runs). Each fit is what the
``fit-baseline`` step does (``components.evaluate.baseline_step``): the first ``eval.baseline_rows`` train rows
(default 1M, so all of them), L2 chosen on as many validation rows, ``eval.baseline_features=2^22`` buckets.

**before** is ``components/evaluate/baseline.py`` at commit ``--before`` (read from git; by default ``BEFORE``, the
L-BFGS on unscaled weights), **after** is the working tree's. Each fit runs in a process of its own (its peak RSS is
its own), before and after alternating, ``--repeats`` times; the table gives medians. The seconds are the fit's alone
(its design matrix included), not reading the shards; on shared cores its CPU seconds (the process's) are the
steadier measure.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
import types
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import log, publish  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "baseline_fit.md"
BEFORE = "9931a4b"  # the last commit with the L-BFGS fit: --before's default
FEATURES = 1 << 22  # eval.baseline_features's default
VOCAB_SIZES = {"hashed 2^20": 1 << 20, "not hashed (2^40)": 1 << 40}
MIB = 1 << 20


def dataset(work: Path, rows: int, vocab_size: int) -> Path:
    """The prepared dataset, cached in ``work``."""
    from bench.table_scale import VARIANTS, input_file
    from components.data_prep.prepare import prepare_files

    out = work / f"dataset-{rows}-{vocab_size.bit_length() - 1}"
    if not (out / "stats.json").exists():
        source, _ = input_file(work, rows, "small", VARIANTS["small"])
        log(f"preparing {source} with table.vocab_size={vocab_size} into {out}")
        prepare_files(out, uri=str(source), fmt="raw", test_fraction=0.1, valid_fraction=0.1, num_shards=2,
                      vocab_size=vocab_size, seed=0, max_malformed_fraction=0.01)
    return out


def solver(version: str, before: str) -> types.ModuleType:
    """The baseline module: the working tree's (``after``) or the one at commit ``before``."""
    if version == "after":
        from components.evaluate import baseline
        return baseline
    source = subprocess.run(["git", "show", f"{before}:components/evaluate/baseline.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("baseline_before")
    exec(compile(source, "baseline_before.py", "exec"), module.__dict__)
    return module


def measure(version: str, data_dir: str, rows: int, before: str) -> dict:
    """One fit, as the fit-baseline step makes it, in this process; prints its numbers as JSON."""
    from components.data_prep.multislot import Schema
    from components.evaluate.baseline_step import _first_rows
    from components.metrics import binary_metrics

    stats = json.loads((Path(data_dir) / "stats.json").read_text())
    schema = Schema.from_dict(stats["schema"])
    train, valid = (_first_rows(data_dir, stats, schema, split, rows) for split in ("train", "valid"))
    test = _first_rows(data_dir, stats, schema, "test", 1 << 62)
    model = solver(version, before).HashedLogisticRegression(FEATURES)
    started, started_cpu = time.perf_counter(), time.process_time()
    model.fit(*train, valid=valid, negative_sample_rate=stats.get("negative_sample_rate", 1.0))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - started_cpu
    scores = binary_metrics(test.labels, model.predict(test.dense, test.sparse))
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "l2": model.l2, "validation_logloss": model.validation_logloss,
            "test_auc": scores["auc"], "test_logloss": scores["logloss"], "train_rows": len(train.labels),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def render(results: dict[str, dict[str, list[dict]]], rows: int, repeats: int, before: str) -> str:
    command = f"python bench/baseline_fit.py --rows {rows} --repeats {repeats} --before {before}"
    lines = [f"# The baseline's fit (`{command}`, {date.today()})",
             "", f"{rows:,} Criteo-like rows, `data=criteo` defaults, {FEATURES:,} buckets; medians of {repeats} fits "
             "each, before and after alternating in one run (2 shared cores).", "",
             "| ids | train rows | version | fit (s), median | fits (s) | after / before | fit CPU (s), median | "
             "L2 chosen | validation logloss along the grid | test AUC | test logloss | peak RSS (MiB) |",
             "|---|---:|---|---:|---|---:|---:|---:|---|---:|---:|---:|"]
    for table, versions in results.items():
        before = statistics.median(run["seconds"] for run in versions["before"])
        for version, runs in versions.items():
            median = statistics.median(run["seconds"] for run in runs)
            cpu = statistics.median(run["cpu_seconds"] for run in runs)
            first = runs[0]
            grid = ", ".join(f"{float(l2):g}: {loss:.6f}" for l2, loss in first["validation_logloss"].items())
            seconds = ", ".join(f"{run['seconds']:.1f}" for run in runs)
            lines.append(f"| {table} | {first['train_rows']:,} | {version} | {median:.1f} | "
                         f"{seconds} | {median / before:.3f} | {cpu:.1f} | "
                         f"{first['l2']:g} | {grid} | {first['test_auc']:.6f} | {first['test_logloss']:.6f} | "
                         f"{max(run['peak_rss'] for run in runs) / MIB:,.0f} |")
        aucs = {version: runs[0]["test_auc"] for version, runs in versions.items()}
        lines.append(f"| {table} | | after - before | | | | | | | {aucs['after'] - aucs['before']:+.1e} | | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-baseline-fit"))
    parser.add_argument("--before", default=BEFORE, help="the commit whose baseline.py is 'before'")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--measure", nargs=2, metavar=("VERSION", "DATA_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure, rows=args.rows, before=args.before)))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, list[dict]]] = {}
    for table, vocab_size in VOCAB_SIZES.items():
        data_dir = dataset(args.work, args.rows, vocab_size)
        results[table] = {"before": [], "after": []}
        for repeat in range(args.repeats):
            for version in ("before", "after"):
                command = [sys.executable, __file__, "--rows", str(args.rows), "--before", args.before,
                           "--measure", version, str(data_dir)]
                out = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout
                results[table][version].append(json.loads(out.splitlines()[-1]))
                log(f"{table} {version} #{repeat + 1}: {json.dumps(results[table][version][-1])}")
    publish(render(results, args.rows, args.repeats, args.before), args.out)


if __name__ == "__main__":
    main()
