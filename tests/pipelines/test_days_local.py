"""Day-by-day training on this machine, end to end: two days, the next-day metric, days.csv, and a rerun that skips."""

import csv
import json

from components.checkpoint.days import COLUMNS, DayLedger
from components.checkpoint.store import CheckpointStore
from components.data_prep.drifting import DriftingSpec, write_days
from components.data_prep.synthetic import DEFAULT_CARDINALITIES
from pipelines.ctr import run
from tests.conftest import compose_config

SPEC = DriftingSpec(days=2, rows_per_day=8_000, cardinalities=tuple(min(c, 1000) for c in DEFAULT_CARDINALITIES))


def test_two_days_continue_one_store_and_a_rerun_skips_them(tmp_path, capsys):
    write_days(tmp_path / "logs", SPEC)
    overrides = ("data=criteo", "experiment=tiny", "ps.epochs=1", "eval.baseline=false",
                 f"data.uri='{tmp_path / 'logs'}/day_{{day}}.tsv'", "data.days=[0,1]")
    run_dir = tmp_path / "run"
    result = run(compose_config(run_dir, *overrides))
    metrics = result.metrics
    out = capsys.readouterr().out
    with open(run_dir / "days.csv") as table:
        rows = list(csv.DictReader(table))
    assert [row["day"] for row in rows] == ["0", "1"] and list(rows[0]) == list(COLUMNS)
    assert rows[0]["eval_auc"] == "" and 0.55 < float(rows[1]["eval_auc"]) < 1  # day 0 has no model before it
    assert float(rows[1]["new_id_fraction"]) > 0.05 and int(rows[1]["table_rows"]) > int(rows[0]["table_rows"])
    ledger = DayLedger(CheckpointStore(str(run_dir / "checkpoint")))
    assert ledger.trained() == ["0", "1"] and rows[1]["checkpoint"] == ledger.entry("1")["checkpoint"]
    # The console: each day's next-day metric and summary line; the run's metrics are the last day's.
    assert "  == day '1' before training on it: auc" in out and out.count("\n  == day '") == 3
    assert metrics == json.loads((run_dir / "metrics.json").read_text())
    assert json.loads((run_dir / "days" / "1" / "metrics.json").read_text()) == metrics
    assert (run_dir / "days.png").is_file() and "Days trained" in (run_dir / "report.md").read_text()
    # The days share the run's step cache (beside run_dir, as for any run outside outputs/<date>/).
    assert (tmp_path / ".kfp-cache").is_dir() and not (run_dir / "days" / ".kfp-cache").exists()
    stats = json.loads(next((run_dir / "days" / "1" / "kfp").rglob("stats.json")).read_text())
    assert stats["day"] == "1" and stats["drift"]["previous_day"] == "0"

    assert result.report == run_dir / "report.html" and result.checkpoint == ledger.entry("1")["checkpoint"]
    rerun = run(compose_config(run_dir, *overrides))  # the same days again: nothing to train
    assert rerun.metrics == {} and rerun.checkpoint is None
    out = capsys.readouterr().out
    assert "day '0': trained already" in out and "day '1': trained already" in out and "nothing to do" in out
    assert DayLedger(CheckpointStore(str(run_dir / "checkpoint"))).trained() == ["0", "1"]
