"""The steps around training, before and after a change: CPU and wall seconds of fit-baseline and evaluate-model.

    python bench/outside_steps.py RUN_DIR [RUN_DIR ...] --before COMMIT [--repeats 1]

``RUN_DIR``: a pipeline run's directory that ``bench/table_scale.py --work DIR`` keeps (``DIR/run-small``,
``DIR/run-large``): its prepared dataset, its resolved config and its trained checkpoint. Each step is what its
component calls (:func:`components.evaluate.baseline_step.fit_baseline`, then
:func:`components.evaluate.step.evaluate_checkpoint` on that baseline), in a process of its own, on the code of
``COMMIT`` (``git archive`` into a temporary directory) and on the working tree's, alternating; CPU seconds are the
steadier measure on a shared machine. Prints a Markdown table, the medians of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import log  # noqa: E402

# Run inside the process of one code version (its root first on sys.path): both steps on the run's artifacts.
_STEPS = """
import json, sys, time
from pathlib import Path
run, out = Path(sys.argv[1]), Path(sys.argv[2])
kfp = next((run / "kfp").iterdir())
config = json.loads((kfp / "resolve-config/executor_output.json").read_text())["parameterValues"]["config"]
checkpoint = json.loads((kfp / "train/executor_output.json").read_text())["artifacts"]["checkpoint"]["artifacts"][0]
data = str(kfp / "merge-data/dataset")
from components.config import from_dict
from components.evaluate.baseline_step import fit_baseline
from components.evaluate.step import evaluate_checkpoint
cfg, times = from_dict(config), {}
wall, cpu = time.perf_counter(), time.process_time()
fit_baseline(data, cfg.eval.baseline_rows, cfg.eval.baseline_features, out / "baseline")
times["fit-baseline"] = (time.process_time() - cpu, time.perf_counter() - wall)
wall, cpu = time.perf_counter(), time.process_time()
metrics, _ = evaluate_checkpoint(config, data, str(kfp / "train/checkpoint"), checkpoint["metadata"],
                                 str(out / "evaluation"), baseline_dir=str(out / "baseline"))
times["evaluate-model"] = (time.process_time() - cpu, time.perf_counter() - wall)
print(json.dumps({"times": times, "auc": metrics["auc"], "baseline_auc": metrics["baseline_auc"]}))
"""


def measure(code_root: Path, run_dir: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="outside-steps-") as out:
        done = subprocess.run([sys.executable, "-c", _STEPS, str(run_dir), out], cwd=code_root, check=True,
                              env={**os.environ, "PYTHONPATH": str(code_root)}, capture_output=True,
                              text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--before", required=True, help="the commit to compare with (e.g. main)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    lines = ["| run | step | CPU before (s) | CPU after (s) | after / before | wall before (s) | wall after (s) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory(prefix="outside-before-") as before_root:
        archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", before_root], input=archive, check=True)
        for run_dir in args.runs:
            results = {"before": [], "after": []}
            for _ in range(args.repeats):
                for name, root in (("before", Path(before_root)), ("after", ROOT)):
                    results[name].append(measure(root, run_dir))
                    log(f"{run_dir.name} {name}: {results[name][-1]}")
            for key in ("auc", "baseline_auc"):  # the same results, whichever code computed them
                if {r[key] for r in results["before"] + results["after"]} != {results["before"][0][key]}:
                    raise SystemExit(f"{run_dir.name}: {key} differs before and after: {results}")
            for step in ("fit-baseline", "evaluate-model"):
                cpu, wall = ({name: statistics.median(r["times"][step][i] for r in runs)
                              for name, runs in results.items()} for i in (0, 1))
                lines.append(f"| {run_dir.name} | {step} | {cpu['before']:.1f} | {cpu['after']:.1f} | "
                             f"{cpu['after'] / cpu['before']:.2f} | {wall['before']:.1f} | {wall['after']:.1f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
