"""A tiny local pipeline run with eval.group_by and eval.slices: the workers' per-row test predictions reach the
checkpoint, line up with the test split, and the evaluation reports GAUC and the slices (about 30 s)."""

import json

import numpy as np

from components.checkpoint import format as ckpt_io
from components.checkpoint.store import CheckpointStore
from components.evaluate.groups import first_ids, grouped_auc
from components.metrics import ScoreCounts
from components.networks.scoring import read_test_split
from pipelines.ctr import run
from tests.conftest import compose_config


def test_a_pipeline_run_reports_gauc_and_slices(tmp_path):
    run_dir = tmp_path / "run"
    run(compose_config(run_dir, "experiment=tiny", "ps.workers=2", "ps.epochs=1", "eval.baseline=false",
                       "eval.group_by=C1", "eval.slices=C2", "eval.slice_top=5"))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["gauc_by"] == "C1" and 0.5 < metrics["gauc"] < 1 and metrics["gauc_groups"] > 10
    assert metrics["slices_by"] == "C2" and len(metrics["slices"]) == 6 and metrics["slices"][-1]["value"] == "other"
    assert sum(row["rows"] for row in metrics["slices"]) == metrics["count"]
    assert 0 < metrics["ne"] < 1
    assert "## Slices by C2" in (run_dir / "report.md").read_text()

    # Each worker's rows, put back in the test split's order, are the rows the merged counts hold.
    store = CheckpointStore(str(run_dir / "checkpoint"))
    local = store.download(store.latest(), tmp_path / "fetched")
    data_dir = next((run_dir / "kfp").rglob("stats.json")).parent
    stats = json.loads((data_dir / "stats.json").read_text())
    assert len(list((local / ckpt_io.SCORES / ckpt_io.TEST_ROWS).iterdir())) == 2
    rows = ckpt_io.load_row_predictions(local, stats["shards"]["test"], stats["shard_rows"]["test"])
    labels, _, sparse = read_test_split(data_dir)
    for preds, split in ((rows.raw, ckpt_io.TEST), (rows.calibrated, ckpt_io.TEST_CALIBRATED)):
        merged = ckpt_io.load_scores(local, split)
        aligned = ScoreCounts.of(labels, preds)
        for field in ("values", "positives", "negatives"):
            np.testing.assert_array_equal(getattr(aligned, field), getattr(merged, field))
    assert grouped_auc(first_ids(sparse[0], "C1"), labels, rows.calibrated)["gauc"] == metrics["gauc"]
