"""The model blends the pipeline's fitted baseline in (model.blend_baseline): the regression inside the scoring
programs is the regression, the blend is fitted on held-out rows the same way however the rows are spread over the
workers, and both export formats serve what the scorer computes."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from components.data_prep.multislot import Schema
from components.data_prep.prepare import prepare_synthetic
from components.evaluate.baseline_step import fit_baseline, load_baseline
from components.export.manifest import MANIFEST
from components.export.model import InferenceModel
from components.export.sharded import export_sharded
from components.export.single import export_single
from components.export.store import VERSION_NAME
from components.calibration import fit_blend
from components.networks.models import baseline_values
from components.networks.scoring import BUCKETS_SUFFIX, Scorer, read_test_split
from tests.export.checkpoints import VOCAB, commit_checkpoint, make_checkpoint

FEATURES = 1 << 12  # fewer buckets than ids: buckets are shared, as at table scale


def _logistic_rows(seed: int, n: int, a: float, c: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    network = rng.normal(0, 1, n)
    baseline = 0.6 * network + rng.normal(0, 0.8, n)  # the two logits are correlated, as a model's and an LR's are
    labels = (rng.random(n) < 1 / (1 + np.exp(-(a * network + c * baseline + b)))).astype(np.int64)
    return np.column_stack([network, baseline]), labels


def test_the_blend_recovers_the_weights_that_made_the_labels():
    logits, labels = _logistic_rows(seed=1, n=40_000, a=0.7, c=1.2, b=-0.5)
    blend = fit_blend(logits, labels)
    assert blend["method"] == "blend"
    # 40,000 rows: each weight's standard error is about 0.02
    assert blend["a"] == pytest.approx(0.7, abs=0.08) and blend["c"] == pytest.approx(1.2, abs=0.08)
    assert blend["b"] == pytest.approx(-0.5, abs=0.08)
    assert fit_blend(logits, np.zeros_like(labels)) is None  # one class: nothing to fit


def test_workers_holding_shares_of_the_rows_fit_the_same_blend_as_one_holding_all():
    logits, labels = _logistic_rows(seed=2, n=10_000, a=1.5, c=0.3, b=0.2)
    weights = np.random.default_rng(3).uniform(0.5, 2.0, len(labels))
    alone = fit_blend(logits, labels, weights)
    shares = [slice(0, 3_000), slice(3_000, 10_000), slice(10_000, 10_000)]  # the last worker holds no row
    barrier, parts, results = threading.Barrier(len(shares)), {}, {}

    def all_reduce(index: int, sums: np.ndarray) -> np.ndarray:
        parts[index] = sums
        barrier.wait()
        total = sum(parts.values())
        barrier.wait()  # every worker has read this round's parts before the next round writes them
        return total

    def worker(index: int, share: slice) -> None:
        results[index] = fit_blend(logits[share], labels[share], weights[share],
                                   all_reduce=lambda sums: all_reduce(index, sums))

    threads = [threading.Thread(target=worker, args=(i, share)) for i, share in enumerate(shares)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results[0] == results[1] == results[2]
    for key in ("a", "b", "c"):
        assert results[0][key] == pytest.approx(alone[key], abs=1e-9)


@pytest.fixture(scope="module")
def blended(tmp_path_factory):
    """A dnn checkpoint whose calibration blends in the baseline fitted on its dataset."""
    root = tmp_path_factory.mktemp("blend")
    data_dir = root / "data"
    prepare_synthetic(data_dir, rows=3000, test_fraction=0.25, num_shards=2, vocab_size=VOCAB, seed=4)
    fit_baseline(data_dir, 3000, FEATURES, root / "baseline")
    checkpoint = make_checkpoint(data_dir, "dnn", seed=7)
    checkpoint.meta["baseline_features"] = FEATURES
    checkpoint.dense.update(baseline_values(str(root / "baseline")))
    return root, data_dir, checkpoint


def _with_blend(checkpoint, **weights):
    checkpoint.meta["calibration"] = {"method": "blend", **weights}
    return checkpoint


def test_the_baseline_inside_the_program_is_the_fitted_regression(blended):
    """With the network's weight 0, the model is the regression: the same buckets, weights and bias."""
    root, data_dir, checkpoint = blended
    _, dense, sparse = read_test_split(data_dir)
    regression, _ = load_baseline(root / "baseline")
    expected = regression.predict(dense, sparse)
    got = Scorer(_with_blend(checkpoint, a=0.0, c=1.0, b=0.0), calibrated=True).predict(dense, sparse)
    assert np.max(np.abs(got - expected)) < 1e-5
    assert len(np.unique(np.round(expected, 4))) > 100  # the regression is not a constant


def test_a_blend_is_the_weighted_sum_of_the_two_logits(blended):
    root, data_dir, checkpoint = blended
    _, dense, sparse = read_test_split(data_dir)
    regression, _ = load_baseline(root / "baseline")
    network = Scorer(checkpoint).predict(dense, sparse).astype(np.float64)
    baseline = regression.predict(dense, sparse)

    def logit(p):
        return np.log(p) - np.log1p(-p)

    got = Scorer(_with_blend(checkpoint, a=0.4, c=0.9, b=-0.3), calibrated=True).predict(dense, sparse)
    expected = 1 / (1 + np.exp(-(0.4 * logit(network) + 0.9 * logit(baseline) - 0.3)))
    assert np.max(np.abs(got - expected)) < 1e-5


def test_both_export_formats_serve_the_blend_and_feed_the_slots_buckets(blended, tmp_path):
    _, data_dir, checkpoint = blended
    checkpoint = _with_blend(checkpoint, a=0.6, c=0.8, b=0.1)
    ckpt = commit_checkpoint(tmp_path / "checkpoint", checkpoint)
    single = export_single(ckpt, tmp_path / "single")
    export_sharded(ckpt, str(tmp_path / "store"))
    _, dense, sparse = read_test_split(data_dir)
    expected = Scorer(checkpoint, calibrated=True).predict(dense, sparse)
    slots = Schema.from_dict(checkpoint.meta["schema"]).sparse_slots
    bucket_feeds = []
    for path, manifest_dir in ((single, single), (tmp_path / "store", tmp_path / "store" / VERSION_NAME.format(1))):
        meta = json.loads((manifest_dir / MANIFEST).read_text())
        assert meta["baseline_features"] == FEATURES
        # after the dense feed and the slots' ids (single) or rows (sharded): each slot's buckets, in slot order
        assert meta["feed_names"][1 + len(slots):] == [f["name"] for f in meta["feeds"][1 + len(slots):]]
        bucket_feeds.append(meta["feed_names"][1 + len(slots):])
        assert [f["dtype"] for f in meta["feeds"][1 + len(slots):]] == ["int64"] * len(slots)
        got = InferenceModel.load(path).predict(dense, sparse)
        assert np.max(np.abs(got - expected)) <= 1e-6
    assert bucket_feeds[0] == bucket_feeds[1] and len(bucket_feeds[0]) == len(slots)
    assert all(name.endswith(BUCKETS_SUFFIX) for name in bucket_feeds[0])
