"""Early stopping and the choice of the delivered checkpoint (components.ps.validation)."""

import pytest

from components.ps.validation import EarlyStopping


@pytest.mark.parametrize("objective,values,best,stops", [
    ("auc", [0.70, 0.72, 0.71, 0.73, 0.73, 0.72], [True, True, False, True, False, False],
     [False, False, False, False, False, True]),
    ("logloss", [0.50, 0.49, 0.495, 0.48], [True, True, False, True], [False, False, False, False]),
])
def test_the_best_checkpoint_and_when_to_stop(objective, values, best, stops):
    stopping = EarlyStopping(objective, patience=2)
    judged = [stopping.judge(f"c{i}", value) for i, value in enumerate(values)]
    assert [b for b, _ in judged] == best and [s for _, s in judged] == stops
    expected_best = max(values) if objective == "auc" else min(values)
    assert stopping.best_value == expected_best and stopping.best_id == f"c{values.index(expected_best)}"


def test_early_stopping_survives_a_resume():
    first = EarlyStopping("auc", patience=2)
    first.judge("a", 0.7)
    first.judge("b", 0.69)
    resumed = EarlyStopping("auc", patience=2, state=first.state())  # what the checkpoint's state.json keeps
    assert resumed.judge("c", 0.68) == (False, True)
    assert resumed.state() == {"best_id": "a", "best_value": 0.7, "stale": 2}


def test_checkpoints_are_judged_and_calibrated_on_predictions_corrected_for_downsampling():
    """The workers count predictions the scoring program corrected for the negative sample rate; the metrics and the
    calibration are of those, not of the network's own."""
    import numpy as np

    from components.config import from_dict
    from components.calibration import fit_platt
    from components.metrics import ScoreCounts, binary_metrics
    from components.networks.scoring import corrected_probability
    from components.ps.validation import Validator

    rng = np.random.default_rng(0)
    preds = rng.uniform(0.05, 0.95, 2000)
    labels = (rng.uniform(size=2000) < corrected_probability(preds, 0.25)).astype(int)
    cfg = from_dict({"data": {"negative_sample_rate": 0.25}, "run_dir": "."})
    corrected = corrected_probability(preds, 0.25)
    verdict = Validator(cfg, EarlyStopping("logloss", 2)).judge("c0", ScoreCounts.of(labels, corrected))
    assert verdict.metrics["logloss"] == pytest.approx(binary_metrics(labels, corrected)["logloss"], rel=1e-9)
    expected = fit_platt(labels, corrected)
    assert verdict.calibration["a"] == pytest.approx(expected["a"], rel=1e-6)
    assert verdict.calibration["b"] == pytest.approx(expected["b"], abs=1e-6)


def test_more_passes_never_deliver_a_worse_model(tmp_path):
    """Small data, plain SGD on the embeddings: the model learns for a pass or two, then overfits. The job stops
    once the validation split stops improving, and delivers the best checkpoint on it, not the last.

    An async PS job is not bit-reproducible, so the passes' scores vary from run to run. The splits are large enough
    that choosing on the validation split also chooses well on the test split: with 2,400 rows each, the pass best
    on validation once scored 0.6635 on test against the first pass's 0.6776; with 12,000 each, three runs gave
    the best pass +0.003 to +0.011 over the first on test. The validation AUC may still improve again at pass 3 or 4
    before the overfitting wins (seen on 2,400 rows: 0.676, 0.693, 0.688, 0.696, 0.628, 0.670), so the maximum
    leaves room for that, and the job's stops are checked against the rule replayed on its own values."""
    import json

    import numpy as np

    from components.checkpoint import format as ckpt_io
    from components.checkpoint.format import EVALUATION_PARTS
    from components.data_prep.multislot import Schema, read_shards
    from components.metrics import binary_metrics
    from components.networks.scoring import Scorer
    from components.table.accessor import read_sparse_table
    from components.checkpoint.pointer import fetch_for_scoring
    from components.config import EvalConfig, from_dict
    from components.data_prep.prepare import prepare_synthetic
    from components.evaluate.evaluate import evaluate
    from components.checkpoint.store import CheckpointStore
    from components.train.step import launch_ps_job, training_summary

    prepare_synthetic(tmp_path / "data", rows=40_000, test_fraction=0.3, valid_fraction=0.3, num_shards=1,
                      vocab_size=1 << 20, seed=3)
    cfg = from_dict({"ps": {"servers": 1, "workers": 1, "epochs": 10, "batch_size": 16, "patience": 2},
                     "model": {"hidden": [64, 32], "learning_rate": 0.01},
                     "table": {"learning_rate": 0.5, "rule": "naive"},
                     "checkpoint": {"uri": str(tmp_path / "ckpt"), "keep_last": 10}, "run_dir": str(tmp_path)})
    result = launch_ps_job(cfg, tmp_path / "data", tmp_path / "logs", echo=lambda line: None)
    judged = [(c["epoch"], c["validation"]["auc"], c["best"]) for c in result.checkpoints]
    replayed = EarlyStopping("auc", patience=2)
    assert [(c["best"], c["stop"]) for c in result.checkpoints] == [
        replayed.judge(c["id"], c["validation"]["auc"]) for c in result.checkpoints], judged
    assert len(result.epochs) < 10 and result.checkpoints[-1]["stop"], judged  # stopped early
    summary = training_summary(result, CheckpointStore(cfg.checkpoint.uri))
    best = max(result.checkpoints, key=lambda c: c["validation"]["auc"])
    assert summary["id"] == best["id"] and summary["stopped_early"]
    test_auc = {c["id"]: evaluate(fetch_for_scoring(cfg.checkpoint.uri, c["id"], tmp_path / c["id"], EVALUATION_PARTS),
                                  tmp_path / "data", tmp_path / f"eval-{c['id']}", EvalConfig(baseline=False))["auc"]
                for c in result.checkpoints}
    first = result.checkpoints[0]["id"]
    assert test_auc[summary["id"]] >= test_auc[first] - 0.002, (judged, test_auc)  # never worse than one pass
    # The model blends the baseline in (the default): each checkpoint was judged on the blended predictions, what it
    # delivers, not on its network's alone.
    stats = json.loads((tmp_path / "data" / "stats.json").read_text())
    labels, dense, sparse = read_shards([tmp_path / "data" / rel for rel in stats["shards"]["valid"]],
                                        Schema.from_dict(stats["schema"]))
    for event in result.checkpoints:
        local = CheckpointStore(cfg.checkpoint.uri).download(event["id"], tmp_path / "full" / event["id"])
        meta = json.loads((local / ckpt_io.MODEL_META).read_text())
        ids, rows = read_sparse_table(local / meta["sparse_table"], cfg.table.rule, cfg.table.embedding_dim)
        with np.load(local / ckpt_io.EXPORT / ckpt_io.DENSE_FILE) as saved:
            ckpt = ckpt_io.Checkpoint(meta=meta, ids=ids, rows=rows, dense={name: saved[name] for name in saved.files})
        assert meta["calibration"]["method"] == "blend"
        delivered = binary_metrics(labels, Scorer(ckpt, calibrated=True).predict(dense, sparse))
        network = binary_metrics(labels, Scorer(ckpt).predict(dense, sparse))
        assert event["validation"]["auc"] == pytest.approx(delivered["auc"], abs=1e-6), (event, network)
        assert event["validation"]["logloss"] == pytest.approx(delivered["logloss"], abs=1e-6), (event, network)
