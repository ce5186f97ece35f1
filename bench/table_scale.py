"""Table scale: the same rows with ever more distinct ids, through the whole pipeline, and every process's memory.

    python bench/table_scale.py [--rows 1000000] [--work DIR] [--out bench/results/table_scale.md] [--quick]
                                [--variants small,large]

Input: ``--rows`` rows of raw Criteo TSV from the Criteo-like generator (``components.data_prep.synthetic``, seed 31),
ids not hashed down (``table.vocab_size=2^40``). Each variant replaces the values of some categorical columns by
values seen once (with a probability per row), as the long tail of real logs does: the rows, the model and every
setting stay; only the table grows. Each variant is one pipeline run, ``python -m pipelines.ctr data=criteo
model=dnn ps.batch_size=512 ps.epochs=1 table.vocab_size=2^40`` (2 servers + 2 workers, default ``ps.stall_timeout_s``
and the sharded serving export).

Measured from outside the run: the peak RSS (``VmHWM``, sampled every 0.2 s) of every process of the run's tree,
by kind (driver, each pipeline step, server, worker, their helpers); from the run's log: the pass, the checkpoint's
save, scoring and upload, each step's duration (kfp.local's task log), and from the Model artifact the rows each
server holds. Then a second PS job resumes the run's checkpoint for a pass: each server's download and load of its
tables (restore throughput). ``--quick`` runs 100k rows (a smoke run of the script).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import PeakMemory, log, publish  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "table_scale.md"
MIB = 1 << 20
SEED = 31
# Variant name -> (columns whose values become values seen once, the probability per row): the long tail.
VARIANTS = {"small": ((3,), 0.6), "large": (tuple(range(6, 26)), 1.0)}
OVERRIDES = ("data=criteo", "model=dnn", "ps.batch_size=512", "ps.epochs=1", f"table.vocab_size={1 << 40}")


def input_file(work: Path, rows: int, name: str, tail: tuple[tuple[int, ...], float]) -> tuple[Path, dict]:
    """The Criteo-like TSV with the variant's long tail, cached in ``work``."""
    from components.data_prep.synthetic import SPECS, write_raw_tsv

    base = work / f"criteo-like-{rows}.tsv"
    if not base.with_suffix(".oracle.json").exists():
        log(f"writing {rows:,} rows of Criteo-like raw TSV to {base}")
        base.with_suffix(".oracle.json").write_text(json.dumps(write_raw_tsv(str(base), rows, SEED,
                                                                             SPECS["criteo_like"])))
    oracle = json.loads(base.with_suffix(".oracle.json").read_text())
    columns, probability = tail
    path = work / f"criteo-like-{rows}-{name}.tsv"
    if not path.exists():
        log(f"{name}: columns {list(columns)} take a value seen once with probability {probability}")
        rng = np.random.default_rng(SEED)
        with open(base) as source, open(path, "w") as out:
            for line in source:
                fields = line.rstrip("\n").split("\t")
                for column in columns:
                    if rng.random() < probability:
                        fields[13 + column] = f"{rng.integers(1 << 62):016x}"
                out.write("\t".join(fields) + "\n")
    return path, oracle


# -- what every process of the run needed -------------------------------------------------------------------------
def process_kind(pid: int) -> str:
    """A readable kind for a process of the run: driver, step:<task>, server, worker, sidecar, the baseline's fit
    beside the job, or its program."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        env = dict(item.split(b"=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                   if b"=" in item)
    except OSError:
        return "gone"
    text = [a.decode(errors="replace") for a in argv if a]
    joined = " ".join(text)
    if "components.ps.role" in joined:
        return "server" if env.get(b"TRAINING_ROLE") == b"PSERVER" else "worker"
    if "components.ps.shard_uploader" in joined:
        return "server sidecar"
    if "components.evaluate.baseline_step" in joined:
        return "baseline fit beside the job"
    if "pipelines.ctr" in joined:
        return "driver"
    found = re.search(r"--function_to_execute\s+(\S+)", joined)
    if found:
        return f"step {found.group(1)}"
    return Path(text[0]).name if text else "?"


# -- one pipeline run -----------------------------------------------------------------------------------------------
_TASK_END = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) - INFO - Task .*'([\w-]+)'.* finished with status")
_TASK_START = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) - INFO - Executing task '([\w-]+)'")
_EPOCH = re.compile(r"== epoch (\d+) done: ([\d,]+) examples in ([\d.]+)s")
_FIT_BESIDE = re.compile(r"== baseline for the blend: fitted beside the job in ([\d.]+)s")
_CHECKPOINT = re.compile(r"== checkpoint \S+ committed .*\[([\d,]+) rows; save ([\d.]+)s(?: \(([\d,]+) rows/s per "
                         r"server\))?, scoring ([\d.]+)s, upload and commit ([\d.]+)s\]")


def run_log(run_dir: Path) -> str:
    """The run's ctr.log without its terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", (run_dir / "ctr.log").read_text())


def step_seconds(log_text: str) -> dict[str, float]:
    """Each step's wall time, from kfp.local's task log lines, in the order the steps ran."""
    starts, ends = {}, {}
    for line in log_text.splitlines():
        for pattern, times in ((_TASK_START, starts), (_TASK_END, ends)):
            found = pattern.match(line)
            if found:
                h, m, s, task = found.groups()
                times[task] = int(h) * 3600 + int(m) * 60 + float(s)
    return {task: ends[task] - starts[task] for task in ends if task in starts}


def pipeline_run(source: Path, oracle: dict, work: Path, name: str) -> dict:
    run_dir = work / f"run-{name}"
    shutil.rmtree(run_dir, ignore_errors=True)  # Hydra appends to an existing ctr.log: one run's lines only
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "pipelines.ctr", *OVERRIDES, f"data.uri={source}",
                              f"hydra.run.dir={run_dir}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    with PeakMemory(child.pid, kind_of=process_kind) as peaks:
        stdout, stderr = child.communicate()
    wall = time.perf_counter() - started
    if child.returncode:
        raise RuntimeError(f"pipeline on {source} failed (exit {child.returncode}):\n{stderr[-3000:]}")
    log_text = run_log(run_dir)
    steps = step_seconds(log_text)
    epoch = _EPOCH.search(log_text)
    fit_beside = _FIT_BESIDE.search(log_text)
    saved = _CHECKPOINT.search(log_text)
    summary = json.loads(next((run_dir / "kfp").rglob("train/checkpoint")).read_text())
    stats = json.loads(next((run_dir / "kfp").rglob("merge-data/dataset/stats.json")).read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    restore = restore_run(run_dir, summary["uri"])
    rows, save_s, rate, score_s, upload_s = saved.groups()
    rows = int(rows.replace(",", ""))
    export_s = steps["export-model"]
    train_s = steps["train"]
    return {"name": name, "distinct_ids": sum(stats["distinct_ids"].values()), "table_rows": rows,
            "server_rows": summary.get("server_rows"), "pass_s": float(epoch.group(3)),
            "train_step_s": train_s, "outside_train_s": wall - train_s, "save_s": float(save_s),
            "save_rows_per_s": float(rate.replace(",", "")) if rate else None, "score_s": float(score_s),
            "upload_s": float(upload_s), "evaluate_s": steps["evaluate-model"], "export_s": export_s,
            "export_rows_per_s": rows / export_s / 2, "wall_s": wall, "auc": metrics["auc"],
            "auc_ratio": metrics["auc"] / oracle["auc"],
            "fit_beside_s": float(fit_beside.group(1)) if fit_beside else None,
            "steps": steps, "peaks": dict(sorted(peaks.peaks.items())), **restore}


_RESTORED = re.compile(r"\[server (\d+)\] restored its tables: download ([\d.]+)s, load ([\d.]+)s")


def restore_run(run_dir: Path, store_uri: str) -> dict:
    """A second PS job resuming the run's checkpoint for one more pass: how long each server took to download and
    load its tables (the slowest server)."""
    from components.config import from_dict
    from components.train.step import launch_ps_job

    config = json.loads(json.dumps(__import__("yaml").safe_load((run_dir / "config.yaml").read_text())))
    config["checkpoint"].update(uri=store_uri, resume="latest")
    config["ps"]["epochs"] = 2
    data_dir = next((run_dir / "kfp").rglob("merge-data/dataset/stats.json")).parent
    lines: list[str] = []
    launch_ps_job(from_dict(config), data_dir, run_dir / "restore-logs", echo=lines.append)
    found = [_RESTORED.search(line) for line in lines]
    restored = [(float(m.group(2)), float(m.group(3))) for m in found if m]
    return {"restore_download_s": max(d for d, _ in restored), "restore_load_s": max(load for _, load in restored)}


# -- report ---------------------------------------------------------------------------------------------------------
def render(runs: list[dict], rows: int) -> str:
    small, large = runs[0], runs[-1]
    kinds = sorted({k for run in runs for k in run["peaks"]}, key=lambda k: (k != "driver", k))
    lines = [f"# Table scale (`python bench/table_scale.py`, {date.today()}, {rows:,} rows, 2 servers + 2 workers)", "",
             "| variant | distinct ids | table rows | run wall (s) | outside the train step (s) | outside / train step | "
             "pass (s) | train step (s) | train step / pass | save (s) | "
             "save rows/s per server | scoring (s) | upload + commit (s) | evaluate step (s) | export step (s) | "
             "export rows/s per server's share | restore: download + load (s) | load rows/s per server | "
             "test AUC / oracle |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        lines.append(f"| {run['name']} | {run['distinct_ids']:,} | {run['table_rows']:,} | {run['wall_s']:.1f} | "
                     f"{run['outside_train_s']:.1f} | {run['outside_train_s'] / run['train_step_s']:.2f} | "
                     f"{run['pass_s']:.1f} | "
                     f"{run['train_step_s']:.1f} | {run['train_step_s'] / run['pass_s']:.2f} | {run['save_s']:.1f} | "
                     f"{run['save_rows_per_s'] or 0:,.0f} | {run['score_s']:.1f} | {run['upload_s']:.1f} | "
                     f"{run['evaluate_s']:.1f} | {run['export_s']:.1f} | {run['export_rows_per_s']:,.0f} | "
                     f"{run['restore_download_s']:.1f} + {run['restore_load_s']:.1f} | "
                     f"{run['table_rows'] / 2 / run['restore_load_s']:,.0f} | {run['auc_ratio']:.3f} |")
    tasks = list(runs[0]["steps"])
    lines += ["", "Each step's wall time (s; kfp.local runs the steps one after another), what the run spent outside "
              "the steps (driver start, kfp.local between steps), and the baseline's fit, which the train step runs "
              "beside its job (components/train/fit_beside.py; fit-baseline then takes the published fit):", "",
              "| variant | " + " | ".join(tasks) + " | outside the steps | the fit, beside the train step |",
              "|---|" + "---:|" * (len(tasks) + 2)]
    for run in runs:
        fit = f"{run['fit_beside_s']:.1f}" if run["fit_beside_s"] is not None else "(published already)"
        lines.append(f"| {run['name']} | " + " | ".join(f"{run['steps'].get(t, 0):.1f}" for t in tasks)
                     + f" | {run['wall_s'] - sum(run['steps'].values()):.1f} | {fit} |")
    lines += ["", "Peak RSS by process kind (MiB; the largest process of each kind), and the large table's over the "
              "small's:", "", "| process | " + " | ".join(run["name"] for run in runs) + " | large / small |",
              "|---|" + "---:|" * (len(runs) + 1)]
    for kind in kinds:
        values = [run["peaks"].get(kind) for run in runs]
        ratio = (f"{values[-1] / values[0]:.2f}" if values[0] and values[-1] else "")
        lines.append(f"| {kind} | " + " | ".join(f"{v / MIB:,.0f}" if v else "" for v in values) + f" | {ratio} |")
    grown = [k for k in kinds if k != "server" and small["peaks"].get(k) and large["peaks"].get(k)
             and large["peaks"][k] > 1.5 * small["peaks"][k]]
    lines += ["", f"Processes other than a server above 1.5x their small-table peak: {', '.join(grown) or 'none'}. "
              f"Train step / pass on the largest table: {large['train_step_s'] / large['pass_s']:.2f} "
              f"(server rows {large['server_rows']})."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-table-scale"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="100k rows: a smoke run of the script")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {', '.join(VARIANTS)} (default: all)")
    args = parser.parse_args()
    chosen = args.variants.split(",")
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
    rows = 100_000 if args.quick else args.rows
    args.work.mkdir(parents=True, exist_ok=True)
    runs = []
    for name in chosen:
        tail = VARIANTS[name]
        source, oracle = input_file(args.work, rows, name, tail)
        log(f"{name}: pipeline run on {source}")
        runs.append(pipeline_run(source, oracle, args.work, name))
        log(json.dumps(runs[-1]))
    publish(render(runs, rows), args.out)


if __name__ == "__main__":
    main()
