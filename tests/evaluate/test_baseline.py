"""The built-in baseline: a hashed logistic regression on the same shards."""

import numpy as np

from components.data_prep.multislot import RaggedIds, Schema, read_shards
from components.data_prep.prepare import prepare_synthetic
from components.evaluate.baseline import HashedLogisticRegression
from components.evaluate.metrics import binary_metrics


def test_it_learns_most_of_what_is_learnable_and_ignores_ids_it_never_saw(tmp_path):
    stats = prepare_synthetic(tmp_path / "d", rows=40_000, test_fraction=0.25, num_shards=1, vocab_size=1 << 20,
                              seed=2)
    schema = Schema.from_dict(stats["schema"])
    train = read_shards([tmp_path / "d" / p for p in stats["shards"]["train"]], schema)
    labels, dense, sparse = read_shards([tmp_path / "d" / p for p in stats["shards"]["test"]], schema)
    model = HashedLogisticRegression().fit(*train)
    auc = binary_metrics(labels, model.predict(dense, sparse))["auc"]
    assert auc > 0.9 * stats["bayes"]["auc"], auc
    unseen = [RaggedIds(np.full(len(labels), 1 << 40), np.arange(len(labels) + 1)) for _ in sparse]
    only_dense = model.predict(dense, unseen)  # every id unknown: the score of the dense part alone
    expected = 1 / (1 + np.exp(-(dense @ model.dense_weights + model.bias)))
    np.testing.assert_allclose(only_dense, expected)
