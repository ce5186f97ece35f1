"""The built-in baseline: a hashed logistic regression on the same shards."""

import numpy as np
import pytest

from components.data_prep.multislot import RaggedIds, Schema, read_shards
from components.data_prep.prepare import prepare_synthetic
from components.evaluate.baseline import HashedLogisticRegression
from components.metrics import binary_metrics


def synthetic_splits(root, vocab_size: int) -> tuple[dict, tuple, tuple]:
    """``(stats, train, test)`` of 40,000 synthetic rows, each split as ``read_shards`` returns it."""
    stats = prepare_synthetic(root, rows=40_000, test_fraction=0.25, num_shards=1, vocab_size=vocab_size, seed=2)
    schema = Schema.from_dict(stats["schema"])
    return stats, *(read_shards([root / p for p in stats["shards"][split]], schema) for split in ("train", "test"))


def test_it_learns_most_of_what_is_learnable_and_ids_of_buckets_it_never_trained_score_0(tmp_path):
    stats, train, (labels, dense, sparse) = synthetic_splits(tmp_path / "d", vocab_size=1 << 20)
    model = HashedLogisticRegression(features=1 << 22).fit(*train)
    auc = binary_metrics(labels, model.predict(dense, sparse))["auc"]
    assert auc > 0.9 * stats["bayes"]["auc"], auc
    # Bucket 1 << 20 lies beyond every id of a 1 << 20 table: no training id reached it.
    unseen = [RaggedIds(np.full(len(labels), (1 << 40) + (1 << 20)), np.arange(len(labels) + 1)) for _ in sparse]
    only_dense = model.predict(dense, unseen)  # the score of the dense part alone
    expected = 1 / (1 + np.exp(-(dense @ model.dense_weights + model.bias)))
    np.testing.assert_allclose(only_dense, expected)


def test_its_weights_are_the_cap_whatever_the_number_of_distinct_ids(tmp_path):
    _, train, (labels, dense, sparse) = synthetic_splits(tmp_path / "d", vocab_size=1 << 30)
    distinct = np.unique(np.concatenate([slot.values for slot in train[2]])).size
    for features in (1 << 8, 1 << 22):  # far fewer buckets than ids, far more
        model = HashedLogisticRegression(features).fit(*train)
        assert model.weights.shape == (features,), (features, distinct)
        assert 0.5 < binary_metrics(labels, model.predict(dense, sparse))["auc"]
    with pytest.raises(ValueError, match="at least one feature bucket"):
        HashedLogisticRegression(0)


def test_a_cap_far_above_the_ids_scores_like_one_weight_per_id(tmp_path):
    # Ids spread over 2**40, so some share one of the 2**22 buckets; the reference gives every distinct id its own.
    _, train, (labels, dense, sparse) = synthetic_splits(tmp_path / "d", vocab_size=1 << 40)
    distinct = np.unique(np.concatenate([slot.values for slot in [*train[2], *sparse]]))
    assert np.unique(distinct % (1 << 22)).size < distinct.size  # collisions do happen at this cap

    def one_weight_per_id(ragged):
        return [RaggedIds(np.searchsorted(distinct, slot.values), slot.offsets) for slot in ragged]

    reference = HashedLogisticRegression(distinct.size).fit(train[0], train[1], one_weight_per_id(train[2]))
    capped = HashedLogisticRegression(1 << 22).fit(*train)
    reference_auc = binary_metrics(labels, reference.predict(dense, one_weight_per_id(sparse)))["auc"]
    capped_auc = binary_metrics(labels, capped.predict(dense, sparse))["auc"]
    assert capped_auc == pytest.approx(reference_auc, abs=0.002)
