"""The built-in baseline: a hashed logistic regression on the same shards, the first model a practitioner would try.

One weight per bucket of ``features`` (``eval.baseline_features``), one per dense value, and a bias, fitted to
convergence by L-BFGS on the first ``eval.baseline_rows`` rows of the train split (the bound is on rows, not on the
data: a larger train split is not read past them). The objective is the weighted logloss summed over those rows plus
``l2 / 2`` times the squared weights (the bias is not penalised): ``l2`` is the precision of a Gaussian prior on
every weight, so the same value means the same shrinkage whatever the number of rows, and scikit-learn's
``LogisticRegression(C=1 / l2)`` fits the same model. ``l2`` is chosen on the validation split from
:data:`L2_GRID`, strong to weak, each fit warm-started from the previous one; without a validation split it is
:data:`DEFAULT_L2`.

An id's bucket is ``id % features``: the ids data prep wrote are already avalanche-hashed and reduced into
``[0, vocab_size)`` (:mod:`components.data_prep.hashing`), so the remainder spreads them evenly, and it gives every
id a weight of its own whenever the table's ``vocab_size`` is at most the cap (a further mix would only add
collisions). Ids sharing a bucket share its weight, and a bucket no training id reached scores 0 (its optimum
under the penalty), so the solver only carries the buckets the train rows reach: its memory is about 200 bytes a
reached bucket (the L-BFGS history) and 12 bytes a train id (the sparse design matrix), bounded by
``baseline_features`` and ``baseline_rows`` whatever the table's size.

Trained on negatively downsampled rows (``data.negative_sample_rate``), its predictions are corrected as the deep
model's are: ``logit + ln(rate)``, i.e. ``q = p / (p + (1 - p) / rate)``. The evaluation reports the deep model's
lift over it: whether the deep model earns its cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
import scipy.optimize
import scipy.sparse
import threadpoolctl

from components.data_prep.multislot import RaggedIds

# Prior precisions, strong to weak: a bucket's weight leaves 0 once its rows outweigh the prior, of the order of
# 5 * l2 rows at a CTR of 0.25 (the loss's curvature there is p * (1 - p) ~ 0.19 a row). On the default synthetic data the best was 30 at 100,000 train rows and 100 at 1,000,000 (its
# neighbours 0.0002 and 0.003 worse in validation logloss there), inside the grid at both ends of the row counts.
L2_GRID = (300.0, 100.0, 30.0, 10.0, 3.0)
# Without a validation split: within 0.0002 of the best validation logloss at both row counts above, where 100
# would cost 0.009 at 100,000 rows.
DEFAULT_L2 = 30.0
MAX_ITERATIONS = 100  # Newton steps: a fit from 0 took 10 on 800k rows
# The solver stops when the gradient of the mean loss, in its rescaled coordinates, has a norm below this: TODO
GRADIENT_TOLERANCE = 1e-6


class Split(NamedTuple):
    """Rows as :func:`components.data_prep.multislot.read_shards` returns them, with optional per-row weights."""

    labels: np.ndarray
    dense: np.ndarray
    sparse: list[RaggedIds]
    weights: Optional[np.ndarray] = None


@dataclass
class _Features:
    """Rows' sparse features as buckets: the buckets of row ``r`` are ``index[starts[r]:starts[r + 1]]``."""

    index: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, sparse: list[RaggedIds], features: int) -> "_Features":
        rows = len(sparse[0].offsets) - 1
        counts = sum(np.diff(slot.offsets) for slot in sparse)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        index = np.empty(starts[-1], np.int64)
        fill = starts[:-1].copy()
        for slot in sparse:  # a row's features: its ids of every slot, slot after slot
            per_row = np.diff(slot.offsets)
            row_of = np.repeat(np.arange(rows), per_row)
            within = np.arange(len(slot.values)) - np.repeat(slot.offsets[:-1], per_row)
            index[fill[row_of] + within] = slot.values % features
            fill += per_row
        return cls(index, starts)

    def rows(self) -> np.ndarray:
        """The row of each entry of ``index``."""
        return np.repeat(np.arange(len(self.starts) - 1), np.diff(self.starts))


def _design(features: _Features, columns: np.ndarray, dense: np.ndarray) -> scipy.sparse.csr_matrix:
    """The rows as a sparse matrix: a 1 in the column of each of their buckets (``columns``: the sorted buckets the
    rows reach, one column each), then their dense values. A bucket a row holds twice counts 2, as in a sum of
    weights."""
    rows, dense_dim = len(features.starts) - 1, dense.shape[1]
    per_row = np.diff(features.starts) + dense_dim
    indptr = np.concatenate([[0], np.cumsum(per_row)])
    if indptr[-1] >= 1 << 31:
        raise ValueError(f"the baseline's {rows:,} rows hold {indptr[-1]:,} features, more than a sparse matrix "
                         f"of int32 indices can: lower eval.baseline_rows")
    indices = np.empty(indptr[-1], np.int32)
    data = np.ones(indptr[-1])
    bucket_at = np.arange(len(features.index)) + np.repeat(indptr[:-1] - features.starts[:-1], np.diff(features.starts))
    indices[bucket_at] = np.searchsorted(columns, features.index)
    dense_at = (indptr[1:] - dense_dim)[:, None] + np.arange(dense_dim)
    indices[dense_at] = len(columns) + np.arange(dense_dim)
    data[dense_at] = dense
    return scipy.sparse.csr_matrix((data, indices, indptr), shape=(rows, len(columns) + dense_dim))


def _logloss(labels: np.ndarray, logits: np.ndarray, weights: Optional[np.ndarray]) -> float:
    losses = np.logaddexp(0.0, logits) - labels * logits
    return float(np.average(losses, weights=weights))


class _Objective:
    """The mean weighted logloss of the rows plus ``penalty / 2`` times the squared weights (the bias is not
    penalised), of the parameters: the design's columns' weights, then the bias. The objective is the fit's divided
    by the total weight, so the tolerances are those of a mean."""

    def __init__(self, design: scipy.sparse.csr_matrix, labels: np.ndarray, row_weights: np.ndarray):
        self.design, self.labels, self.row_weights = design, labels, row_weights
        # Hessian-vector products only steer the solver's steps (the loss and gradient that accept them are float64):
        # float32 values, sharing the design's indices, take half its time a product.
        self.design32 = scipy.sparse.csr_matrix((design.data.astype(np.float32), design.indices, design.indptr),
                                                shape=design.shape)
        squares = scipy.sparse.csr_matrix((np.square(design.data), design.indices, design.indptr), shape=design.shape)
        self.column_squares = np.append(squares.T @ row_weights, row_weights.sum())  # the bias: a column of ones
        self._curvature_at: Optional[np.ndarray] = None
        self.penalty = 0.0

    def minimise(self, penalty: float, start: np.ndarray) -> np.ndarray:
        """The parameters minimising the objective at ``penalty``, from ``start``.

        Newton's method in a trust region (``trust-ncg``: conjugate gradients on Hessian-vector products), in
        coordinates rescaled by the diagonal of the Hessian at logits 0 (``0.25 * sum of a column's squares +
        penalty``): a bucket's count of rows ranges from 1 to ~1e5, so unscaled the Hessian's diagonal spans five
        orders of magnitude and L-BFGS needed ~1,500 evaluations at l2 30 on 800k rows (343 s); rescaled, Newton
        needs ~10 steps (bench/results/baseline_fit.md)."""
        self.penalty = penalty
        self._curvature_at = None
        diagonal = 0.25 * self.column_squares
        diagonal[:-1] += penalty  # the bias is not penalised
        scale = 1.0 / np.sqrt(diagonal)

        def loss_and_gradient(coordinates: np.ndarray) -> tuple[float, np.ndarray]:
            loss, gradient = self.loss_and_gradient(scale * coordinates)
            return loss, scale * gradient

        def hessian_times(coordinates: np.ndarray, direction: np.ndarray) -> np.ndarray:
            return scale * self.hessian_times(scale * coordinates, scale * direction)

        # One BLAS thread: the solver's vector operations are too short for OpenBLAS's threads, which spin against
        # each other on a busy machine (a 24,000-row fit took 93 s with them on 2 loaded cores, 3.7 s without).
        with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
            result = scipy.optimize.minimize(loss_and_gradient, start / scale, jac=True, hessp=hessian_times,
                                             method="trust-ncg",
                                             options={"maxiter": MAX_ITERATIONS, "gtol": GRADIENT_TOLERANCE})
        return scale * result.x

    def loss_and_gradient(self, parameters: np.ndarray) -> tuple[float, np.ndarray]:
        weights, bias = parameters[:-1], parameters[-1]
        logits = self.design @ weights + bias
        loss = (self.row_weights @ (np.logaddexp(0.0, logits) - self.labels * logits)
                + 0.5 * self.penalty * (weights @ weights))
        error = self.row_weights * (1.0 / (1.0 + np.exp(-logits)) - self.labels)
        return loss, np.append(self.design.T @ error + self.penalty * weights, error.sum())

    def hessian_times(self, parameters: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """The Hessian at ``parameters`` times ``direction``: ``X' diag(w p (1 - p)) X v + penalty v``, the rows'
        curvatures computed once for the many products the solver takes at one point."""
        if self._curvature_at is None or not np.array_equal(parameters, self._curvature_at):
            probabilities = 1.0 / (1.0 + np.exp(-(self.design @ parameters[:-1] + parameters[-1])))
            self._curvatures = self.row_weights * probabilities * (1.0 - probabilities)
            self._curvature_at = parameters.copy()
        along = self._curvatures * (self.design32 @ direction[:-1].astype(np.float32) + direction[-1])
        return np.append(self.design32.T @ along.astype(np.float32) + self.penalty * direction[:-1], along.sum())


class HashedLogisticRegression:
    def __init__(self, features: int):
        if features < 1:
            raise ValueError(f"the baseline needs at least one feature bucket, got features={features}")
        self.features = features

    def fit(self, labels: np.ndarray, dense: np.ndarray, sparse: list[RaggedIds],
            weights: Optional[np.ndarray] = None, *, valid: Optional[Split] = None,
            negative_sample_rate: float = 1.0) -> "HashedLogisticRegression":
        """Fit on the given rows (``weights``: each row's share of the loss); ``l2`` is chosen on ``valid`` when it
        has rows, else :data:`DEFAULT_L2`. ``negative_sample_rate``: the fraction of negatives the rows kept; the
        validation rows and every later prediction are taken as not downsampled."""
        if not 0 < negative_sample_rate <= 1:
            raise ValueError(f"the negative sample rate is a fraction in (0, 1], got {negative_sample_rate}")
        self.logit_shift = math.log(negative_sample_rate)
        train = _Features.of(sparse, self.features)
        columns = np.unique(train.index)
        design = _design(train, columns, dense.astype(np.float64))
        del train
        labels = labels.astype(np.float64)
        total_weight = float(weights.sum()) if weights is not None else float(len(labels))
        row_weights = (weights if weights is not None else np.ones(len(labels))) / total_weight
        self.dense_dim = dense.shape[1]
        objective = _Objective(design, labels, row_weights)
        grid = L2_GRID if valid is not None and len(valid.labels) else (DEFAULT_L2,)
        valid_features = _Features.of(valid.sparse, self.features) if len(grid) > 1 else None
        parameters = np.zeros(design.shape[1] + 1)  # the columns' weights, then the bias
        self.validation_logloss: dict[float, float] = {}  # of each l2 tried, as corrected predictions score it
        best = None
        for l2 in grid:
            parameters = objective.minimise(l2 / total_weight, parameters)
            self._keep(columns, parameters)
            if valid_features is None:
                best = (l2, self.weights, self.dense_weights, self.bias)
                break
            # Chosen on the validation logloss, not its AUC: logloss is what the fit minimises and it scores the
            # over-confident weights of rare ids that the penalty is there to shrink (AUC, a ranking, is blind to
            # the confidence and to the downsampling correction); on a small validation split it is also the
            # steadier of the two along the grid.
            loss = _logloss(valid.labels, self._logits(valid_features, valid.dense), valid.weights)
            self.validation_logloss[l2] = loss
            if best is not None and loss >= self.validation_logloss[best[0]]:
                break  # past the best: weaker penalties overfit further (and are the slowest to fit)
            best = (l2, self.weights, self.dense_weights, self.bias)
        self.l2, self.weights, self.dense_weights, self.bias = best
        return self

    def _keep(self, columns: np.ndarray, parameters: np.ndarray) -> None:
        """Spread the fitted parameters over every bucket (those no train row reached stay 0)."""
        self.weights = np.zeros(self.features)
        self.weights[columns] = parameters[:len(columns)]
        self.dense_weights, self.bias = parameters[len(columns):-1], float(parameters[-1])

    def _logits(self, features: _Features, dense: np.ndarray) -> np.ndarray:
        """Corrected for the downsampling: the logits of rows as scored (never downsampled)."""
        return (np.bincount(features.rows(), weights=self.weights[features.index], minlength=len(dense))
                + dense @ self.dense_weights + self.bias + self.logit_shift)

    def predict(self, dense: np.ndarray, sparse: list[RaggedIds]) -> np.ndarray:
        """Click probabilities, corrected for the train rows' negative downsampling."""
        return 1.0 / (1.0 + np.exp(-self._logits(_Features.of(sparse, self.features), dense)))
