"""GAUC and slices (components.evaluate.groups) against brute force, the workers' per-row predictions on their way
into a checkpoint and back in the test split's order, the config's slot checks, and one evaluation that reports
them (no Paddle: the checkpoint's scores are written by hand)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from components.checkpoint import format as ckpt_io
from components.checkpoint import protocol
from components.checkpoint.store import CheckpointStore
from components.config import ConfigError, EvalConfig
from components.config_rules import CRITEO_SLOT_NAMES, check_eval_slots, validate
from components.data_prep.formats import CRITEO_SLOTS
from components.data_prep.multislot import RaggedIds
from components.data_prep.synthetic import SyntheticSpec
from components.evaluate.groups import OTHER_SLICE, first_ids, grouped_auc, slice_metrics
from components.metrics import ScoreCounts


def pair_auc(labels: np.ndarray, preds: np.ndarray, weights: np.ndarray) -> float:
    """The AUC by counting every (positive, negative) pair, each weighing the product of its rows' weights, ties
    one half."""
    positive, negative = labels == 1, labels == 0
    above = preds[positive][:, None] > preds[negative][None, :]
    tied = preds[positive][:, None] == preds[negative][None, :]
    pair_weights = weights[positive][:, None] * weights[negative][None, :]
    return float(np.sum(pair_weights * (above + 0.5 * tied)) / np.sum(pair_weights))


def brute_force_gauc(groups, labels, preds, weights=None) -> dict:
    weighted = weights is not None
    weights = np.ones(labels.size) if weights is None else weights
    aucs, impressions, skipped_rows, skipped = [], [], 0, 0
    for group in np.unique(groups):
        rows = groups == group
        w = weights[rows]
        if w[labels[rows] == 1].sum() > 0 and w[labels[rows] == 0].sum() > 0:
            aucs.append(pair_auc(labels[rows], preds[rows], w))
            impressions.append(w.sum() if weighted else rows.sum())
        else:
            skipped, skipped_rows = skipped + 1, skipped_rows + int(rows.sum())
    return {"gauc": float(np.dot(aucs, impressions) / np.sum(impressions)), "gauc_groups": len(aucs),
            "gauc_skipped_groups": skipped, "gauc_skipped_rows": skipped_rows}


def grouped_rows(seed: int, size: int = 600, group_count: int = 40):
    """Zipf-ish groups (some of one row or one class), predictions on a coarse grid (ties) tied to the labels."""
    rng = np.random.default_rng(seed)
    groups = (rng.zipf(1.5, size) % group_count) * 7919  # ids, not ranks
    preds = (rng.integers(0, 11, size) / 10.0).astype(np.float32)
    labels = (rng.random(size) < 0.1 + 0.7 * preds).astype(np.int64)
    weights = rng.integers(0, 4, size) * 0.5  # zeros too: a group's positives may all weigh 0
    return groups, labels, preds, weights


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_gauc_matches_the_impression_weighted_mean_of_pair_counted_group_aucs(seed, weighted):
    groups, labels, preds, weights = grouped_rows(seed)
    weights = weights if weighted else None
    found = grouped_auc(groups, labels, preds, weights)
    expected = brute_force_gauc(groups, labels, preds.astype(np.float64), weights)
    assert found["gauc"] == pytest.approx(expected["gauc"], abs=1e-12)
    assert {k: v for k, v in found.items() if k != "gauc"} == {k: v for k, v in expected.items() if k != "gauc"}
    assert found["gauc_skipped_groups"] > 0  # the data has groups of one class


def test_gauc_with_weight_two_is_gauc_with_the_row_twice():
    groups, labels, preds, _ = grouped_rows(3)
    twice = np.arange(labels.size) % 3 == 0
    weights = np.where(twice, 2.0, 1.0)
    duplicated = np.concatenate([np.arange(labels.size), np.flatnonzero(twice)])
    weighted = grouped_auc(groups, labels, preds, weights)
    assert weighted["gauc"] == pytest.approx(grouped_auc(groups[duplicated], labels[duplicated],
                                                         preds[duplicated])["gauc"], abs=1e-12)


def test_gauc_without_a_group_of_both_classes_is_none():
    assert grouped_auc([1, 1, 2], [1, 1, 0], [0.2, 0.3, 0.4]) == {
        "gauc": None, "gauc_groups": 0, "gauc_skipped_groups": 2, "gauc_skipped_rows": 3}
    assert grouped_auc([], [], [])["gauc"] is None


@pytest.mark.parametrize("weighted", [False, True])
def test_slices_are_the_most_frequent_values_then_the_rest(weighted):
    groups, labels, preds, weights = grouped_rows(4)
    weights = weights + 0.25 if weighted else None  # no zero weight: every slice has a CTR
    uncalibrated = np.clip(preds * 0.8 + 0.05, 0, 1)
    table = slice_metrics(groups, labels, preds, 3, weights, uncalibrated=uncalibrated)
    values, rows = np.unique(groups, return_counts=True)
    top = [int(v) for v in values[np.lexsort((values, -rows))][:3]]
    assert [row["value"] for row in table] == [*top, OTHER_SLICE]
    w = np.ones(labels.size) if weights is None else weights
    for row in table:
        chosen = ~np.isin(groups, top) if row["value"] == OTHER_SLICE else groups == row["value"]
        ctr = np.sum(w[chosen] * labels[chosen]) / np.sum(w[chosen])
        mean_pred = np.sum(w[chosen] * preds[chosen]) / np.sum(w[chosen])
        assert row["rows"] == chosen.sum() and row["ctr"] == pytest.approx(ctr)
        assert row["mean_pred"] == pytest.approx(mean_pred) and row["calibration"] == pytest.approx(mean_pred / ctr)
        assert row["auc"] == pytest.approx(pair_auc(labels[chosen], preds[chosen].astype(np.float64), w[chosen]))
        assert row["uncalibrated_calibration"] == pytest.approx(np.sum(w[chosen] * uncalibrated[chosen]) /
                                                                np.sum(w[chosen]) / ctr)
        assert ("weight" in row) == weighted


def test_a_slice_of_one_class_has_no_auc_and_no_other_row_when_the_top_covers_every_value():
    table = slice_metrics([5, 5, 9, 9], [0, 0, 1, 0], [0.1, 0.3, 0.6, 0.2], top=5)
    assert [row["value"] for row in table] == [5, 9]  # a tie in rows: the smaller id first
    assert table[0]["auc"] is None and table[0]["ctr"] == 0 and table[0]["calibration"] is None
    assert table[1]["auc"] == 1.0 and table[1]["calibration"] == pytest.approx(0.4 / 0.5)


def test_a_row_is_grouped_by_its_first_id():
    slot = RaggedIds(np.array([4, 8, 8, 3, 5]), np.array([0, 2, 3, 5]))
    assert first_ids(slot, "C1").tolist() == [4, 8, 3]
    with pytest.raises(ValueError, match="1 test rows hold no id of slot 'C1'"):
        first_ids(RaggedIds(np.array([4]), np.array([0, 1, 1])), "C1")


# -- the workers' per-row predictions: into the checkpoint and back in the test split's order --------------------
def test_per_row_predictions_reach_the_checkpoint_and_come_back_in_the_splits_order(tmp_path):
    shards, shard_rows = ["test/part-0", "test/part-1", "test/part-2"], [3, 2, 4]
    starts = np.cumsum([0, *shard_rows])
    raw = np.arange(9, dtype=np.float32) / 10
    store, staging = CheckpointStore(str(tmp_path / "store")), tmp_path / "staging"
    for worker in range(2):  # as split_share deals them: worker 0 shards 0 and 2, worker 1 shard 1
        mine = list(range(worker, 3, 2))
        rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in mine])
        part = ckpt_io.RowPredictions([shards[i] for i in mine], [shard_rows[i] for i in mine], raw[rows],
                                      1 - raw[rows], np.full(rows.size, 2.0))
        work = tmp_path / f"worker-{worker}"
        work.mkdir()
        protocol.upload_row_predictions(store, "pass-0001", worker, part, work)
        assert not list(work.iterdir())  # the local copy is gone once uploaded
    protocol.collected_row_predictions(store, "pass-0001", 2, staging)
    assert sorted(p.name for p in (staging / ckpt_io.SCORES / ckpt_io.TEST_ROWS).iterdir()) == \
        ["worker-00000.npz", "worker-00001.npz"]
    loaded = ckpt_io.load_row_predictions(staging, shards, shard_rows)
    np.testing.assert_array_equal(loaded.raw, raw)
    np.testing.assert_array_equal(loaded.calibrated, 1 - raw)
    np.testing.assert_array_equal(loaded.weights, np.full(9, 2.0))
    with pytest.raises(ckpt_io.CheckpointError, match="test shard test/part-1 has 3 rows but checkpoint .* holds 2"):
        ckpt_io.load_row_predictions(staging, shards, [3, 3, 4])
    with pytest.raises(ckpt_io.CheckpointError, match="no worker saved per-row predictions of test shard test/x"):
        ckpt_io.load_row_predictions(staging, [*shards, "test/x"], [*shard_rows, 1])
    with pytest.raises(ckpt_io.CheckpointError, match="holds no per-row test predictions"):
        ckpt_io.load_row_predictions(tmp_path / "empty", shards, shard_rows)
    with pytest.raises(ValueError, match="4 raw for the 3 rows of shards"):
        ckpt_io.RowPredictions(["a"], [3], np.zeros(4, np.float32))


# -- eval.group_by / eval.slices name a slot of the data --------------------------------------------------------
def test_the_configs_criteo_slots_are_the_formats_and_the_generators():
    assert list(CRITEO_SLOT_NAMES) == list(CRITEO_SLOTS) == SyntheticSpec().sparse_slots


@pytest.mark.parametrize("overrides, message", [
    (("eval.group_by=C27",), "config key 'eval.group_by' has value 'C27'; allowed: a sparse slot of the data: C1, "),
    (("eval.slices=user",), "config key 'eval.slices' has value 'user'"),
    (("data.source=files", "data.uri=/d/*.txt", "data.slots=[C1,C2]", "eval.group_by=C3"),
     "allowed: a sparse slot of the data: C1, C2$"),
    (("data.source=files", "data.uri=/d/*.txt", "data.format=feasign", "data.slots=['2','3']", "eval.slices=4"),
     "'eval.slices' has value '4'; allowed: a sparse slot of the data: 2, 3$"),
    (("eval.slice_top=0",), "config key 'eval.slice_top' has value 0"),
])
def test_an_unknown_eval_slot_is_one_line_before_data_prep(config, overrides, message):
    with pytest.raises(ConfigError, match=message) as raised:
        validate(config(*overrides))
    assert "\n" not in str(raised.value)


def test_feasign_slots_are_checked_once_the_schema_is_known(config):
    validate(config("data.source=files", "data.uri=/d/*.txt", "data.format=feasign", "eval.group_by=7"))
    with pytest.raises(ConfigError, match="'eval.group_by' has value '7'; allowed: a sparse slot of the data: 2, 3"):
        check_eval_slots(EvalConfig(group_by="7"), ["2", "3"])


# -- one evaluation with eval.group_by and eval.slices ------------------------------------------------------------
def test_the_evaluation_reports_gauc_ne_and_slices(tmp_path):
    from components.data_prep.prepare import prepare_synthetic
    from components.config import from_dict
    from components.evaluate.evaluate import evaluate
    from components.networks.scoring import read_test_split
    from components.ps.tls import plaintext_warning
    from tests.conftest import commit_staged_checkpoint

    data = tmp_path / "data"
    stats = prepare_synthetic(data, rows=4000, test_fraction=0.5, num_shards=2, vocab_size=1 << 16, seed=1)
    labels, _, sparse = read_test_split(data)
    rng = np.random.default_rng(0)
    raw = np.clip(0.15 + 0.4 * labels + rng.normal(0, 0.2, labels.size), 0.01, 0.99).astype(np.float32)
    calibration = {"method": "platt", "a": 1.0, "b": -0.1}
    calibrated = (1 / (1 + np.exp(-(np.log(raw / (1 - raw)) - 0.1)))).astype(np.float32)
    staged = tmp_path / "staged"
    (staged / ckpt_io.SCORES).mkdir(parents=True)
    ScoreCounts.of(labels, raw).save(staged / ckpt_io.SCORES / f"{ckpt_io.TEST}.npz")
    ScoreCounts.of(labels, calibrated).save(staged / ckpt_io.SCORES / f"{ckpt_io.TEST_CALIBRATED}.npz")
    shards, shard_rows = stats["shards"]["test"], stats["shard_rows"]["test"]
    starts = np.cumsum([0, *shard_rows])
    for worker, shard in enumerate(shards):  # two workers, one test shard each
        rows = slice(starts[worker], starts[worker + 1])
        path = staged / ckpt_io.row_predictions_file(worker)
        path.parent.mkdir(parents=True, exist_ok=True)
        ckpt_io.RowPredictions([shard], [shard_rows[worker]], raw[rows], calibrated[rows]).save(path)
    meta = {"model": {"name": "dnn"}, "mode": "async", "servers": 1, "workers": 2, "rows": 10,
            "table": {"embedding_dim": 8, "rule": "adagrad"}, "schema": stats["schema"],
            "hash_function": stats.get("hash_function"), "calibration": calibration}
    checkpoint = commit_staged_checkpoint(staged, meta)

    out = tmp_path / "eval"
    cfg = EvalConfig(baseline=False, group_by="C1", slices="C2", slice_top=4)
    plaintext = plaintext_warning(from_dict({"ps": {"tls": "off"}}), compose=True)  # what a compose job's says
    result = evaluate(checkpoint, data, out, cfg, warnings=(plaintext,))
    written = json.loads((out / "metrics.json").read_text())
    group_of_row = [first_ids(slot, name) for slot, name in zip(sparse[:2], ("C1", "C2"))]
    expected = grouped_auc(group_of_row[0], labels, calibrated)
    assert written["gauc"] == pytest.approx(expected["gauc"]) and written["gauc_by"] == "C1"
    assert written["gauc_groups"] == expected["gauc_groups"] > 1
    assert written["ne"] == pytest.approx(result["ne"]) and 0 < written["ne"] < 1
    assert written["slices_by"] == "C2" and len(written["slices"]) == 5
    assert written["slices"] == json.loads(json.dumps(slice_metrics(group_of_row[1], labels, calibrated, 4,
                                                                    uncalibrated=raw)))
    assert [row["count"] for row in written["calibration_bins"]] == [200] * 10
    report = (out / "report.md").read_text()
    assert "| GAUC (AUC per group, weighted by the group's impressions) |" in report
    assert "| NE (logloss / entropy of the observed CTR) |" in report
    assert "## Slices by C2 (its 4 most frequent ids, then every other)" in report
    assert f"| {OTHER_SLICE} | {written['slices'][-1]['rows']:,} |" in report
    assert "How the job ran (warnings)" in report and "ps.tls=off: the PS plane" in report and "plaintext" in report
