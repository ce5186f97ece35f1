"""The whole pipeline's wall time before and after a change: table_scale's runs on the code of a commit and on the
working tree's, side by side.

    python bench/run_wall.py --before COMMIT [--variants small,large] [--repeats 2] [--work DIR]

Each run is ``python -m pipelines.ctr`` with table_scale's overrides on its variant's input (written into ``--work``
once, as ``bench/table_scale.py`` does), in a run directory and a step cache of its own (nothing is taken from another
run's cache), the two versions alternating (``COMMIT``'s from ``git archive``). Prints a Markdown table of each run:
its wall time, the train step's, what was outside it, and each step's (kfp.local's task log).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import log  # noqa: E402
from bench.table_scale import OVERRIDES, VARIANTS, input_file, run_log, step_seconds  # noqa: E402


def pipeline_wall(code_root: Path, source: Path, run_dir: Path) -> tuple[float, dict[str, float]]:
    """``(the run's wall time, each step's)`` of the pipeline on ``source`` with the code at ``code_root``."""
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipelines.ctr", *OVERRIDES, f"data.uri={source}",
                    f"hydra.run.dir={run_dir}", f"cluster.local_cache_root={run_dir / 'cache'}"],
                   cwd=code_root, env={**os.environ, "PYTHONPATH": str(code_root)}, check=True, capture_output=True, text=True)
    return time.perf_counter() - started, step_seconds(run_log(run_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="the commit to compare with (e.g. main)")
    parser.add_argument("--variants", default="small,large")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "table-scale")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    lines = ["| variant | code | run wall (s) | train step (s) | outside it (s) | outside / train | steps (s) |",
             "|---|---|---:|---:|---:|---:|---|"]
    with tempfile.TemporaryDirectory(prefix="run-wall-before-") as before_root:
        archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", before_root], input=archive, check=True)
        for name in args.variants.split(","):
            source, _ = input_file(args.work, args.rows, name, VARIANTS[name])
            for repeat in range(args.repeats):
                for code, root in ((args.before, Path(before_root)), ("working tree", ROOT)):
                    wall, steps = pipeline_wall(root, source, args.work / f"wall-{name}-{repeat}")
                    train = steps["train"]
                    log(f"{name} {code}: {wall:.1f} s, train step {train:.1f} s")
                    lines.append(f"| {name} | {code} | {wall:.1f} | {train:.1f} | {wall - train:.1f} | "
                                 f"{(wall - train) / train:.2f} | "
                                 + ", ".join(f"{step} {seconds:.1f}" for step, seconds in steps.items()) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
