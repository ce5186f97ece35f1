"""Model quality: every model on the default synthetic data and on Criteo-like raw TSV with a known oracle, against the
built-in hashed logistic regression; calibration over repeated runs; early stopping against more passes.

    python bench/quality.py [--quick] [--rows N] [--work DIR] [--out bench/results/quality.md]

Each row of the tables is one pipeline run (``python -m pipelines.ctr``, 2 servers + 2 workers on this machine), its
numbers read from the run's ``metrics.json``:

* **models**: ``model=dnn|wide_deep|deepfm|dcn`` (the data option's default model first) on the default synthetic
  data (its Bayes ceiling is the oracle) and on
  ``--rows`` rows of Criteo-like raw TSV (``python -m components.data_prep.synthetic --criteo-like``, seed 22: not the
  seed the ``data=criteo`` defaults were tuned on, 21; its oracle is the generator's Bayes AUC over all its rows);
* **calibration**: the default model, three runs on each data set: mean prediction / observed CTR after calibration
  (Platt, fitted on the validation split) and before;
* **early stopping**: ``ps.epochs=1`` against ``ps.epochs=3`` on the Criteo-like data, three runs each (the runs'
  spread is their noise).

``--quick``: 100k rows, the calibration and early-stopping checks only (about 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import log, publish  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "quality.md"
MODELS = ("dnn", "wide_deep", "deepfm", "dcn")
RUNS = 3


def criteo_like(work: Path, rows: int, seed: int) -> tuple[Path, dict]:
    path = work / f"criteo-like-{rows}-{seed}.tsv"
    oracle = Path(f"{path}.oracle.json")
    if not oracle.exists():
        log(f"writing {rows:,} rows of Criteo-like TSV (seed {seed})")
        subprocess.run([sys.executable, "-m", "components.data_prep.synthetic", "--criteo-like", "--rows", str(rows),
                        "--seed", str(seed), "--out", str(path)], cwd=ROOT, check=True, capture_output=True)
    return path, json.loads(oracle.read_text())


def pipeline(work: Path, name: str, overrides: list[str]) -> dict:
    run_dir = work / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipelines.ctr", *overrides, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["model"] = OmegaConf.load(run_dir / "config.yaml").model.name  # a data option may choose the model
    log(f"  {name}: auc {metrics['auc']:.4f} (baseline {metrics.get('baseline_auc', float('nan')):.4f}), "
        f"calibration {metrics['calibration']:.3f}, {time.perf_counter() - started:.0f} s")
    return metrics


def render(models: list[dict], calibration: list[dict], stopping: dict, meta: dict) -> str:
    lines = [f"# Model quality ({meta['when']}, {meta['cpus']} cores)", "",
             f"`python bench/quality.py{' --quick' if meta['quick'] else ''}`: each row a pipeline run, 2 servers + "
             f"2 workers, defaults of `data=synthetic` / `data=criteo` (Criteo-like: {meta['rows']:,} rows, seed 22, "
             f"oracle AUC {meta['oracle']:.4f}). Method: the docstring of `bench/quality.py`.", ""]
    if models:
        lines += ["| data | model | test AUC | AUC / oracle | LR baseline AUC | lift over LR | calibration | ECE |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {m['data']} | {m['model']} | {m['auc']:.4f} | {m['auc'] / m['oracle']:.3f} | "
                  f"{m['baseline_auc']:.4f} | {m['lift_auc']:+.4f} | {m['calibration']:.3f} | {m['ece']:.4f} |"
                  for m in models]
        lines += [f"| {d} | oracle | {o:.4f} | 1.000 | | | | |" for d, o in meta["oracles"].items()] + [""]
    lines += ["Calibration (mean prediction / observed CTR on the test split), default model:", "",
              "| data | run | after calibration | before | ECE after | ECE before |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {c['data']} | {c['run']} | **{c['calibration']:.3f}** | {c['uncalibrated_calibration']:.3f} | "
              f"{c['ece']:.4f} | {c['uncalibrated_ece']:.4f} |" for c in calibration]
    within = all(0.97 <= c["calibration"] <= 1.03 for c in calibration)
    lines += ["", f"Every run within [0.97, 1.03] after calibration: **{'yes' if within else 'no'}**.", "",
              "Early stopping (Criteo-like data, default model; test AUC per run):", "",
              "| ps.epochs | runs | mean | min | max |", "|---:|---|---:|---:|---:|"]
    for epochs, aucs in stopping.items():
        lines.append(f"| {epochs} | {', '.join(f'{a:.4f}' for a in aucs)} | {statistics.mean(aucs):.4f} | "
                     f"{min(aucs):.4f} | {max(aucs):.4f} |")
    if len(stopping) == 2:
        one, three = (statistics.mean(v) for v in stopping.values())
        lines += ["", f"ps.epochs=3 - ps.epochs=1, mean test AUC: **{three - one:+.4f}**."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, default=None, help="Criteo-like rows (default 500k, --quick 100k)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-quality")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = args.rows or (100_000 if args.quick else 500_000)
    args.work.mkdir(parents=True, exist_ok=True)
    source, oracle = criteo_like(args.work, rows, seed=22)
    datasets = {"synthetic": [], "criteo-like": ["data=criteo", f"data.uri={source}"]}
    models, calibration, stopping = [], [], {1: [], 3: []}
    oracles = {"criteo-like": oracle["auc"]}
    for data, overrides in datasets.items():
        for run in range(1, RUNS + 1):
            log(f"{data}, default model, run {run}")
            metrics = pipeline(args.work, f"{data}-default-{run}", overrides)
            oracles.setdefault(data, metrics.get("bayes_auc"))
            calibration.append({"data": data, "run": run, **metrics})
            if run == 1:
                models.append({"data": data, "oracle": oracles[data], **metrics,
                               "model": f"{metrics['model']} (default)"})
        if not args.quick:
            for model in (m for m in MODELS if m != calibration[-1]["model"]):
                log(f"{data}, model={model}")
                metrics = pipeline(args.work, f"{data}-{model}", [*overrides, f"model={model}"])
                models.append({"data": data, "model": model, "oracle": oracles[data], **metrics})
    stopping[1] = [m["auc"] for m in calibration if m["data"] == "criteo-like"]  # the default: ps.epochs=1
    for run in range(1, RUNS + 1):
        log(f"criteo-like, ps.epochs=3, run {run}")
        stopping[3].append(pipeline(args.work, f"epochs3-{run}", [*datasets["criteo-like"], "ps.epochs=3"])["auc"])
    meta = {"when": datetime.now().strftime("%Y-%m-%d %H:%M"), "cpus": __import__("os").cpu_count(),
            "quick": args.quick, "rows": rows, "oracle": oracle["auc"], "oracles": oracles}
    table = render(models if not args.quick else [], calibration, stopping, meta)
    publish(table, args.out)


if __name__ == "__main__":
    main()
