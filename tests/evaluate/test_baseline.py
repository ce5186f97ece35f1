"""The built-in baseline: a hashed logistic regression on the same shards, as good as scikit-learn's on its features."""

import json

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse
import threadpoolctl
from sklearn.linear_model import LogisticRegression

from components.data_prep.multislot import RaggedIds, Schema, read_shards
from components.data_prep.prepare import prepare_synthetic
from components.evaluate import baseline
from components.evaluate.baseline import HashedLogisticRegression, Split
from components.evaluate.baseline_step import fit_baseline, load_baseline
from components.metrics import binary_metrics

PARITY_FEATURES = 1 << 16  # few enough one-hot columns for scikit-learn, enough that most ids keep their own


def synthetic_splits(root, vocab_size: int) -> tuple[dict, Split, Split, Split]:
    """``(stats, train, valid, test)`` of 40,000 synthetic rows (24,000 / 6,000 / 10,000)."""
    stats = prepare_synthetic(root, rows=40_000, test_fraction=0.25, valid_fraction=0.15, num_shards=1,
                              vocab_size=vocab_size, seed=2)
    schema = Schema.from_dict(stats["schema"])
    return stats, *(Split(*read_shards([root / p for p in stats["shards"][split]], schema))
                    for split in ("train", "valid", "test"))


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("d")


@pytest.fixture(scope="module")
def splits(dataset_dir):
    return synthetic_splits(dataset_dir, vocab_size=1 << 20)


def one_hot(split: Split, features: int) -> scipy.sparse.csr_matrix:
    """The baseline's features as scikit-learn sees them: a column per bucket (a count), then the dense values."""
    rows = len(split.labels)
    buckets = scipy.sparse.csr_matrix((rows, features))
    for slot in split.sparse:
        row_of = np.repeat(np.arange(rows), np.diff(slot.offsets))
        buckets = buckets + scipy.sparse.csr_matrix((np.ones(len(slot.values)), (row_of, slot.values % features)),
                                                    shape=(rows, features))
    return scipy.sparse.hstack([buckets, scipy.sparse.csr_matrix(split.dense.astype(np.float64))], format="csr")


def scikit_learn(train: Split, l2: float, features: int) -> LogisticRegression:
    """scikit-learn's L2 logistic regression, run to convergence: it minimises C times the weighted logloss summed
    over the rows plus half the squared weights, the baseline's objective divided by l2."""
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):  # as the baseline runs: see fit
        return LogisticRegression(C=1 / l2, tol=1e-10, max_iter=10_000).fit(
            one_hot(train, features), train.labels, sample_weight=train.weights)


def take(split: Split, rows: np.ndarray) -> Split:
    """The given rows of ``split``, in that order (repeats allowed)."""
    sparse = []
    for slot in split.sparse:
        counts = np.diff(slot.offsets)[rows]
        starts = np.repeat(slot.offsets[rows], counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        sparse.append(RaggedIds(slot.values[starts + within], np.concatenate([[0], np.cumsum(counts)])))
    weights = None if split.weights is None else split.weights[rows]
    return Split(split.labels[rows], split.dense[rows], sparse, weights)


def auc(split: Split, predictions: np.ndarray) -> float:
    return binary_metrics(split.labels, predictions)["auc"]


def test_it_scores_like_scikit_learn_fitted_with_the_penalty_it_chose_on_the_validation_split(splits):
    stats, train, valid, test = splits
    model = HashedLogisticRegression(PARITY_FEATURES).fit(*train, valid=valid)
    assert list(model.validation_logloss) == list(baseline.L2_GRID[:len(model.validation_logloss)])
    assert model.l2 == min(model.validation_logloss, key=model.validation_logloss.get)
    reference = scikit_learn(train, model.l2, PARITY_FEATURES)
    expected = reference.predict_proba(one_hot(test, PARITY_FEATURES))[:, 1]
    predictions = model.predict(test.dense, test.sparse)
    assert auc(test, predictions) == pytest.approx(auc(test, expected), abs=0.003)
    np.testing.assert_allclose(predictions, expected, atol=0.003)  # the same model, not only the same ranking
    assert auc(test, expected) > 0.9 * stats["bayes"]["auc"]


def test_weighted_rows_count_as_often_as_their_weight_and_score_like_scikit_learn(splits):
    _, train, _, test = splits
    weights = np.random.default_rng(0).integers(1, 3, len(train.labels)).astype(np.float64)  # 1 or 2
    weighted = HashedLogisticRegression(PARITY_FEATURES).fit(*train[:3], weights)
    twice = np.repeat(np.arange(len(weights)), weights.astype(int))  # a row of weight 2, twice
    repeated = HashedLogisticRegression(PARITY_FEATURES).fit(*take(train, twice)[:3])
    np.testing.assert_allclose(weighted.predict(test.dense, test.sparse), repeated.predict(test.dense, test.sparse),
                               atol=1e-4)
    reference = scikit_learn(train._replace(weights=weights), baseline.DEFAULT_L2, PARITY_FEATURES)
    expected = reference.predict_proba(one_hot(test, PARITY_FEATURES))[:, 1]
    assert auc(test, weighted.predict(test.dense, test.sparse)) == pytest.approx(auc(test, expected), abs=0.003)


def test_fitted_on_downsampled_negatives_its_predictions_are_corrected_to_the_full_rate(splits):
    _, train, valid, test = splits
    rate = 0.25
    kept = np.flatnonzero((train.labels == 1) | (np.random.default_rng(1).random(len(train.labels)) < rate))
    downsampled = take(train, kept)
    model = HashedLogisticRegression(PARITY_FEATURES).fit(*downsampled[:3], valid=valid, negative_sample_rate=rate)
    predictions = model.predict(test.dense, test.sparse)
    # Fitted on 4 times the test's odds of a click; corrected, it predicts the test's click rate on average.
    assert downsampled.labels.mean() > 2 * test.labels.mean()
    assert predictions.mean() == pytest.approx(test.labels.mean(), rel=0.05)
    reference = scikit_learn(downsampled, model.l2, PARITY_FEATURES)
    logits = reference.decision_function(one_hot(test, PARITY_FEATURES)) + np.log(rate)
    expected = 1 / (1 + np.exp(-logits))
    assert auc(test, predictions) == pytest.approx(auc(test, expected), abs=0.003)
    assert binary_metrics(test.labels, predictions)["logloss"] == pytest.approx(
        binary_metrics(test.labels, expected)["logloss"], abs=0.003)
    with pytest.raises(ValueError, match="negative sample rate"):
        HashedLogisticRegression(PARITY_FEATURES).fit(*downsampled[:3], negative_sample_rate=0)


def test_without_a_validation_split_it_takes_the_default_penalty(splits):
    _, train, valid, _ = splits
    empty = take(valid, np.arange(0))
    for given in (None, empty):
        model = HashedLogisticRegression(PARITY_FEATURES).fit(*train[:3], valid=given)
        assert model.l2 == baseline.DEFAULT_L2 and model.validation_logloss == {}


def test_its_solver_reaches_the_minimum_plain_l_bfgs_reaches_run_to_a_far_tighter_tolerance(splits):
    # The rescaled two-level Newton solver against L-BFGS on the raw weights (the solver it replaced), both from 0:
    # the same minimum of the same objective.
    _, train, _, _ = splits
    objective = baseline._Objective.of(*train, features=PARITY_FEATURES)
    start = np.zeros(objective.design.shape[1] + 1)
    solved = objective.minimise(baseline.DEFAULT_L2 / objective.total_weight, start)
    ours, _ = objective.loss_and_gradient(solved)  # at the penalty minimise took
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):  # as the baseline runs: see fit
        plain = scipy.optimize.minimize(objective.loss_and_gradient, start, jac=True, method="L-BFGS-B",
                                        options={"maxiter": 100_000, "ftol": 1e-15, "gtol": 1e-12})
    assert ours == pytest.approx(plain.fun, rel=1e-9)
    np.testing.assert_allclose(solved, plain.x, atol=1e-5)


def test_the_chosen_penalty_fitted_on_from_its_loose_grid_fit_lands_where_a_fit_from_0_does(splits):
    # The grid's points are fitted to GRID_TOLERANCE only; the chosen one is then fitted on to GRADIENT_TOLERANCE.
    _, train, valid, _ = splits
    model = HashedLogisticRegression(PARITY_FEATURES).fit(*train, valid=valid)
    objective = baseline._Objective.of(*train, features=PARITY_FEATURES)
    start = np.zeros(objective.design.shape[1] + 1)
    loose = objective.minimise(model.l2 / objective.total_weight, start, baseline.GRID_TOLERANCE)
    direct = objective.minimise(model.l2 / objective.total_weight, start)
    delivered = np.concatenate([model.weights[objective.columns], model.dense_weights, [model.bias]])
    (direct_loss, _), (loose_loss, _) = objective.loss_and_gradient(direct), objective.loss_and_gradient(loose)
    assert objective.loss_and_gradient(delivered)[0] == pytest.approx(direct_loss, rel=1e-12)
    assert loose_loss != pytest.approx(direct_loss, rel=1e-12)  # the refinement is not idle
    np.testing.assert_allclose(delivered, direct, atol=1e-6)
    scored = binary_metrics(valid.labels, model.predict(valid.dense, valid.sparse))["logloss"]
    assert model.validation_logloss[model.l2] == pytest.approx(scored, rel=1e-9)  # the delivered model's


def test_its_transposes_products_are_the_design_transposes(splits):
    # Kept as CSR matrices of their own (a sum per row instead of a scatter), in float64 and float32.
    _, train, _, _ = splits
    objective = baseline._Objective.of(*train, features=PARITY_FEATURES)
    rows = np.random.default_rng(3).standard_normal(objective.design.shape[0])
    np.testing.assert_allclose(objective.transpose @ rows, objective.design.T @ rows, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(objective.transpose32 @ rows.astype(np.float32),
                               objective.design32.T @ rows.astype(np.float32), rtol=1e-5, atol=1e-5)
    assert np.shares_memory(objective.transpose32.indices, objective.transpose.indices)  # one copy of the indices


def _dataset_with_stats(dataset_dir, root, stats) -> str:
    """The dataset's shards under ``root`` with ``stats`` as its stats.json."""
    root.mkdir()
    for entry in dataset_dir.iterdir():
        if entry.name != "stats.json":
            (root / entry.name).symlink_to(entry)
    (root / "stats.json").write_text(json.dumps(stats))
    return str(root)


def test_the_baseline_step_fits_on_the_first_rows_and_records_the_penalty_and_where_it_came_from(
        dataset_dir, splits, tmp_path):
    stats, _, _, test = splits

    def fitted(data_dir, name):
        fit = fit_baseline(data_dir, rows=10_000, features=1 << 16, out_dir=tmp_path / name)
        model, recorded = load_baseline(tmp_path / name)
        assert recorded == fit
        return model.predict(test.dense, test.sparse), fit

    _, fit = fitted(dataset_dir, "full")
    assert fit["baseline_rows"] == 10_000 and fit["baseline_l2"] in baseline.L2_GRID
    assert fit["baseline_l2_chosen_by"] == "validation logloss of 6,000 rows" and fit["baseline_features"] == 1 << 16
    no_valid = {**stats, "shards": {**stats["shards"], "valid": []}, "shard_rows": {**stats["shard_rows"], "valid": []}}
    full_rate, fit = fitted(_dataset_with_stats(dataset_dir, tmp_path / "no-valid", no_valid), "no-valid-fit")
    assert fit["baseline_l2"] == baseline.DEFAULT_L2
    assert fit["baseline_l2_chosen_by"] == "default: the dataset has no validation split"
    # Rows said to have kept half their negatives: the same fit, its predictions' odds halved.
    halved, _ = fitted(_dataset_with_stats(dataset_dir, tmp_path / "halved", {**no_valid, "negative_sample_rate": 0.5}),
                       "halved-fit")
    np.testing.assert_allclose(halved / (1 - halved), 0.5 * full_rate / (1 - full_rate), rtol=1e-9)


def test_the_saved_baseline_predicts_what_the_fitted_one_does(dataset_dir, splits, tmp_path):
    _, train, valid, test = splits
    fit_baseline(dataset_dir, rows=10_000, features=PARITY_FEATURES, out_dir=tmp_path / "saved")
    loaded, fit = load_baseline(tmp_path / "saved")
    first = take(train, np.arange(10_000))
    fitted = HashedLogisticRegression(PARITY_FEATURES).fit(*first[:3], valid=take(valid, np.arange(
        min(10_000, len(valid.labels)))))
    assert fit["baseline_l2"] == fitted.l2
    np.testing.assert_allclose(loaded.predict(test.dense, test.sparse), fitted.predict(test.dense, test.sparse),
                               rtol=1e-9)


def test_ids_of_buckets_it_never_trained_score_0(splits):
    _, train, _, test = splits
    model = HashedLogisticRegression(features=1 << 22).fit(*train[:3])
    # Bucket 1 << 20 lies beyond every id of a 1 << 20 table: no training id reached it.
    rows = len(test.labels)
    unseen = [RaggedIds(np.full(rows, (1 << 40) + (1 << 20)), np.arange(rows + 1)) for _ in test.sparse]
    only_dense = model.predict(test.dense, unseen)  # the score of the dense part alone
    expected = 1 / (1 + np.exp(-(test.dense @ model.dense_weights + model.bias)))
    np.testing.assert_allclose(only_dense, expected)


def test_its_weights_are_the_cap_whatever_the_number_of_distinct_ids(tmp_path):
    _, train, _, test = synthetic_splits(tmp_path / "d", vocab_size=1 << 30)
    distinct = np.unique(np.concatenate([slot.values for slot in train.sparse])).size
    for features in (1 << 8, 1 << 22):  # far fewer buckets than ids, far more
        model = HashedLogisticRegression(features).fit(*train[:3])
        assert model.weights.shape == (features,), (features, distinct)
        assert 0.5 < auc(test, model.predict(test.dense, test.sparse))
    with pytest.raises(ValueError, match="at least one feature bucket"):
        HashedLogisticRegression(0)


def test_a_cap_far_above_the_ids_scores_like_one_weight_per_id(tmp_path):
    # Ids spread over 2**40, so some share one of the 2**22 buckets; the reference gives every distinct id its own.
    _, train, _, test = synthetic_splits(tmp_path / "d", vocab_size=1 << 40)
    distinct = np.unique(np.concatenate([slot.values for slot in [*train.sparse, *test.sparse]]))
    assert np.unique(distinct % (1 << 22)).size < distinct.size  # collisions do happen at this cap

    def one_weight_per_id(ragged):
        return [RaggedIds(np.searchsorted(distinct, slot.values), slot.offsets) for slot in ragged]

    reference = HashedLogisticRegression(distinct.size).fit(train.labels, train.dense, one_weight_per_id(train.sparse))
    capped = HashedLogisticRegression(1 << 22).fit(*train[:3])
    reference_auc = auc(test, reference.predict(test.dense, one_weight_per_id(test.sparse)))
    capped_auc = auc(test, capped.predict(test.dense, test.sparse))
    assert capped_auc == pytest.approx(reference_auc, abs=0.002)
