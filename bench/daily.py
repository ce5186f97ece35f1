"""Day-by-day training against training once and retraining from scratch, on drifting multi-day logs.

    python bench/daily.py [--rows-per-day 150000] [--days 4] [--work DIR] [--out bench/results/daily.md]

Input: ``components.data_prep.drifting`` (seed 0): each day new ids arrive while popular ones persist, id weights
rotate, the CTR shifts; each day's oracle is known. Every variant is the command a user runs,
``python -m pipelines.ctr data=criteo "data.uri='<work>/day_{day}.tsv'" data.days=[...]`` with its own checkpoint
store, and every number is a ``days.csv`` column, so all variants are scored by the same code (each day's model
before training on the day, on all of that day's rows):

* **daily**: ``data.days=[0,1,...,D-1]``: each day continues the model of the day before;
* **once**: ``data.days=[0,D-1]``: trained on day 0 only, judged on the last day;
* **retrain k**: ``data.days=[d0-(k-1),dk]`` over directories of hard links: the first "day" holds days 0..k-1, trained
  at once from scratch (the last day's retrain is the fair reference for the daily model; its train step's seconds
  grow with k), the second day k.

The table: the last day's next-day AUC of each, the oracle's, the daily model's time per day against the retrains'.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import log, publish  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "daily.md"


def run_days(work: Path, name: str, days: list[str], uri: str) -> list[dict]:
    """One pipeline run over ``days`` of ``uri`` (a store of its own); its days.csv rows."""
    run_dir = work / name
    command = [sys.executable, "-m", "pipelines.ctr", "data=criteo", f"data.uri='{uri}'",
               "data.days=[" + ",".join(f"'{day}'" for day in days) + "]", f"hydra.run.dir={run_dir}",
               "eval.baseline=false"]
    log(f"{name}: {' '.join(command[3:])}")
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    with open(run_dir / "days.csv") as rows:
        return list(csv.DictReader(rows))


def retrain_input(work: Path, k: int) -> str:
    """Two "days" as directories of hard links to the logs: days 0..k-1 together, then day k."""
    root = work / f"retrain-{k}-input"
    for name, days in ((f"d0-{k - 1}", range(k)), (f"d{k}", [k])):
        (root / name).mkdir(parents=True, exist_ok=True)
        for day in days:
            link = root / name / f"day_{day}.tsv"
            if not link.exists():
                os.link(work / "logs" / f"day_{day}.tsv", link)
    return f"{root}/{{day}}"


def render(spec: dict, oracle: dict, daily: list[dict], once: list[dict], retrains: dict[int, list[dict]]) -> str:
    last = str(spec["days"] - 1)

    def auc(rows: list[dict], day: str) -> float:  # the last row: the day judged (retrains name it d<k>)
        return float(next(r for r in rows if r["day"] in (day, f"d{day}"))["eval_auc"])

    reference = retrains[spec["days"] - 1]
    lines = [f"# Day-by-day training (`python bench/daily.py`, {date.today()}, {spec['days']} days x "
             f"{spec['rows_per_day']:,} rows, 2 servers + 2 workers, data=criteo defaults)", "",
             f"Next-day AUC on day {last} (the model before training on it, on all of its rows):", "",
             "| model | trained on | AUC on the last day | vs daily |", "|---|---|---:|---:|"]
    variants = [("daily", f"days 0..{last}, one after the other", auc(daily, last)),
                ("once", "day 0 only", auc(once, last)),
                (f"retrain {spec['days'] - 1}", f"days 0..{int(last) - 1} at once, from scratch", auc(reference, last)),
                ("oracle", "the true click probabilities", oracle[last]["auc"])]
    for name, trained, value in variants:
        lines.append(f"| {name} | {trained} | {value:.4f} | {value - variants[0][2]:+.4f} |")
    lines += ["", "Per day (daily: its days.csv; the retrain: its train step on days 0..day at once, from scratch):", "",
              "| day | next-day AUC (daily) | oracle AUC | new ids | table rows | daily train step (s) | "
              "retrain on days 0..day: train step (s) |", "|---|---:|---:|---:|---:|---:|---:|"]
    def cell(value: str, spec: str) -> str:
        return format(float(value), spec) if value else "-"

    for row in daily:
        k = int(row["day"]) + 1
        retrain = retrains[k][0]["seconds"] if k < spec["days"] else ""
        lines.append(f"| {row['day']} | {cell(row['eval_auc'], '.4f')} | {oracle[row['day']]['auc']:.4f} | "
                     f"{cell(row['new_id_fraction'], '.1%')} | {int(row['table_rows']):,} | "
                     f"{float(row['seconds']):.1f} | {cell(retrain, '.1f')} |")
    seconds = [float(r["seconds"]) for r in daily]
    lines += ["", f"Daily minus once on day {last}: {variants[0][2] - variants[1][2]:+.4f} AUC; daily minus retrain: "
              f"{variants[0][2] - variants[2][2]:+.4f}; daily's last day over its second: "
              f"{seconds[-1] / seconds[1]:.2f}x the train step time."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows-per-day", type=int, default=150_000)
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-daily"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    from components.data_prep.drifting import DriftingSpec, write_days

    spec = DriftingSpec(days=args.days, rows_per_day=args.rows_per_day)
    args.work.mkdir(parents=True, exist_ok=True)
    log(f"writing {spec.days} days of {spec.rows_per_day:,} rows to {args.work / 'logs'}")
    oracle = write_days(args.work / "logs", spec)
    last, days_uri = spec.days - 1, f"{args.work / 'logs'}/day_{{day}}.tsv"
    daily = run_days(args.work, "daily", [str(d) for d in range(spec.days)], days_uri)
    once = run_days(args.work, "once", ["0", str(last)], days_uri)
    retrains = {1: once}
    for k in range(2, spec.days):
        retrains[k] = run_days(args.work, f"retrain-{k}", [f"d0-{k - 1}", f"d{k}"], retrain_input(args.work, k))
    (args.work / "results.json").write_text(json.dumps({"daily": daily, "retrains": retrains}, indent=2))
    publish(render({"days": spec.days, "rows_per_day": spec.rows_per_day}, oracle, daily, once, retrains), args.out)


if __name__ == "__main__":
    main()
