"""Day-by-day PS jobs: a day is scored before it is trained, continues the day before's model and dense optimizer, and
ages the table once."""

import json

import numpy as np
import pytest

from components.checkpoint import format as ckpt_io
from components.checkpoint.days import DayLedger
from components.checkpoint.restore import day_restore_target, resume_state
from components.checkpoint.store import CheckpointStore
from components.config import SparseRule, from_dict
from components.data_prep.drifting import DriftingSpec, write_days
from components.data_prep.synthetic import DEFAULT_CARDINALITIES
from components.data_prep.multislot import Schema, read_shards
from components.data_prep.prepare import prepare_files
from components.metrics import binary_metrics
from components.table.accessor import read_sparse_table
from components.networks.scoring import Scorer
from components.train.step import launch_ps_job

DAYS = ("0", "1")
# Raw Criteo rows hold 26 categorical fields; small vocabularies keep the tables small.
SPEC = DriftingSpec(days=2, rows_per_day=12_000, cardinalities=tuple(min(c, 2000) for c in DEFAULT_CARDINALITIES))


def _config(tmp_path, day):
    return from_dict({
        "ps": {"servers": 1, "workers": 2, "epochs": 2, "batch_size": 64},
        "data": {"source": "files", "uri": str(tmp_path / "logs" / "day_{day}.tsv"), "days": list(DAYS), "day": day},
        "model": {"hidden": [32, 16]},
        "table": {"learning_rate": 0.05, "eviction": {"enabled": True, "delete_after_unseen_days": 30}},
        "checkpoint": {"uri": str(tmp_path / "ckpt"), "keep_last": 10},
        "run_dir": str(tmp_path),
    })


@pytest.fixture(scope="module")
def two_days(tmp_path_factory):
    """Day 0, then day 1 from what day 0 delivered (recorded in the ledger as the train step records it)."""
    tmp_path = tmp_path_factory.mktemp("days")
    write_days(tmp_path / "logs", SPEC)
    results, data = {}, {}
    for day in DAYS:
        data[day] = tmp_path / f"data-{day}"
        prepare_files(data[day], uri=str(tmp_path / "logs" / f"day_{day}.tsv"), fmt="raw", test_fraction=0.1,
                      valid_fraction=0.1, num_shards=2, vocab_size=1 << 20, seed=0, max_malformed_fraction=0.0)
        results[day] = launch_ps_job(_config(tmp_path, day), data[day], tmp_path / f"logs-{day}",
                                     echo=lambda line: None)
        delivered = CheckpointStore(str(tmp_path / "ckpt")).best()
        DayLedger(CheckpointStore(str(tmp_path / "ckpt"))).record({"day": day, "checkpoint": delivered}, None, {})
    return tmp_path, results, data


def _checkpoint(store, ckpt_id, tmp_path):
    local = store.download(ckpt_id, tmp_path / "fetched" / ckpt_id)
    return local, json.loads((local / ckpt_io.MODEL_META).read_text())


def test_a_day_is_scored_by_the_day_befores_model_before_any_training_on_it(two_days, tmp_path):
    """Day 1's next-day metrics are those of day 0's delivered checkpoint (its rows, dense parameters and calibration)
    scored in one process on every row of day 1: nothing of day 1 was trained before it was scored."""
    root, results, data = two_days
    store = CheckpointStore(str(root / "ckpt"))
    assert results["0"].day_eval is None  # the first day has no model before it
    evaluated = results["1"].day_eval
    first = DayLedger(store).entry("0")["checkpoint"]
    assert results["1"].restored_from.id == evaluated["checkpoint"] == first and evaluated["previous_day"] == "0"
    local, meta = _checkpoint(store, first, tmp_path)
    ids, rows = read_sparse_table(local / meta["sparse_table"], SparseRule.adagrad, meta["table"]["embedding_dim"])
    with np.load(local / ckpt_io.EXPORT / ckpt_io.DENSE_FILE) as saved:
        params = {name: saved[name] for name in saved.files}
    stats = json.loads((data["1"] / "stats.json").read_text())
    shards = [data["1"] / rel for split in ("train", "valid", "test") for rel in stats["shards"][split]]
    labels, dense, sparse = read_shards(shards, Schema.from_dict(stats["schema"]))
    assert evaluated["calibrated"] and meta["calibration"]
    # through the calibration it carries (the blend with its baseline: model.blend_baseline), in the program
    preds = Scorer(ckpt_io.Checkpoint(meta=meta, ids=ids, rows=rows, dense=params), calibrated=True).predict(dense,
                                                                                                         sparse)
    expected = binary_metrics(labels, preds)
    assert evaluated["metrics"]["count"] == expected["count"] == SPEC.rows_per_day
    assert evaluated["metrics"]["auc"] == pytest.approx(expected["auc"], abs=1e-4)
    assert evaluated["metrics"]["logloss"] == pytest.approx(expected["logloss"], abs=1e-4)


def _dense_table(local):
    parts = sorted((local / ckpt_io.TABLES / "001").glob("part-*"))
    return np.concatenate([np.loadtxt(part, ndmin=2) for part in parts])  # param, Adam's moment 1 and moment 2


def test_a_day_continues_the_dense_optimizer(two_days, tmp_path):
    """The servers load day 0's dense tables, Adam's moments with them: after day 1's first pass the second moment
    still carries most of day 0's (beta2 = 0.999 over ~200 steps); restarted moments would hold a few percent."""
    root, results, _ = two_days
    store = CheckpointStore(str(root / "ckpt"))
    before = _dense_table(_checkpoint(store, results["1"].restored_from.id, tmp_path)[0])
    after = _dense_table(_checkpoint(store, results["1"].checkpoints[0]["id"], tmp_path)[0])
    assert before.shape == after.shape and before.shape[1] == 3
    assert after[:, 2].mean() / before[:, 2].mean() > 0.5


def _unseen_days(table_dir):
    """id -> the unseen-days count the server saved with its row (the third field of a saved line)."""
    found = {}
    for part in table_dir.glob("part-*"):
        for line in part.read_text().splitlines():
            fields = line.split()
            found[int(fields[0])] = float(fields[2])
    return found


def test_rows_age_once_per_day(two_days, tmp_path):
    """With day partitions a row ages once a day, however many checkpoints the day takes (two here): a row day 0
    trained and day 1 did not is one day unseen after day 1 (per-checkpoint aging would say three)."""
    root, results, data = two_days
    store = CheckpointStore(str(root / "ckpt"))
    assert len(results["1"].checkpoints) == 2
    local, meta = _checkpoint(store, results["1"].checkpoints[-1]["id"], tmp_path)
    unseen = _unseen_days(local / meta["sparse_table"])

    def train_ids(day):
        stats = json.loads((data[day] / "stats.json").read_text())
        _, _, sparse = read_shards([data[day] / rel for rel in stats["shards"]["train"]],
                                   Schema.from_dict(stats["schema"]))
        return set(np.unique(np.concatenate([slot.values for slot in sparse])).tolist())

    only_day_0 = train_ids("0") - train_ids("1")
    assert only_day_0 and {unseen[i] for i in only_day_0} == {1.0}
    assert {unseen[i] for i in train_ids("1")} == {0.0}


def test_a_killed_day_resumes_its_own_checkpoint_and_the_next_day_starts_fresh(two_days):
    """Day 1's own latest checkpoint is what a restarted day 1 continues (inside its passes and early stopping); day 2
    starts from the checkpoint day 1 delivered, at pass 1, with the next-day scoring due."""
    root, results, _ = two_days
    store = CheckpointStore(str(root / "ckpt"))
    latest = store.latest()
    assert day_restore_target(store, "1") == latest == results["1"].checkpoints[-1]["id"]
    assert day_restore_target(store, "2") == DayLedger(store).entry("1")["checkpoint"]
    target = type(results["1"].restored_from)(store.uri, latest, resume=True)
    assert resume_state(store, target, "1")["epoch"] == 2 and not resume_state(store, target, "1")["new_day"]
    fresh = resume_state(store, target, "2")
    assert fresh["epoch"] == 0 and fresh["history"] == [] and fresh["new_day"]
