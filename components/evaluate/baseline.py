"""The built-in baseline: a hashed logistic regression on the same shards, the first model a practitioner would try.

One weight per bucket of ``features`` (``eval.baseline_features``), one per dense value, and a bias, fitted to
convergence on the first ``eval.baseline_rows`` rows of the train split (the bound is on rows, not on the data: a
larger train split is not read past them) by Newton's method, preconditioned (:meth:`_Objective.minimise`): the
whole fit on 800k Criteo-like rows, along the L2 grid, takes 14-15 CPU seconds (2026-12-06, 0.7x the 20 of the
fit that fitted every grid point fully and scattered the transpose's products), and the fit before that, L-BFGS,
took 7-8x longer for the same optimum (bench/results/baseline_fit.md). The objective is the weighted logloss
summed over those rows plus ``l2 / 2`` times the squared weights (the bias is not penalised): ``l2`` is the
precision of a Gaussian prior on every weight, so the same value means the same shrinkage whatever the number of
rows, and scikit-learn's ``LogisticRegression(C=1 / l2)`` fits the same model. ``l2`` is chosen on the validation
split from :data:`L2_GRID`, strong to weak, each fit warm-started from the previous one to :data:`GRID_TOLERANCE`
and the chosen one then on to :data:`GRADIENT_TOLERANCE`; without a validation split it is :data:`DEFAULT_L2`.

An id's bucket is ``id % features``: the ids data prep wrote are already avalanche-hashed and reduced into
``[0, vocab_size)`` (:mod:`components.data_prep.hashing`), so the remainder spreads them evenly, and it gives every
id a weight of its own whenever the table's ``vocab_size`` is at most the cap (a further mix would only add
collisions). Ids sharing a bucket share its weight, and a bucket no training id reached scores 0 (its optimum
under the penalty), so the solver only carries the buckets the train rows reach: its memory is about 110 bytes a
reached bucket (the solver's vectors), 32 bytes a train id or dense value (the sparse design matrix and its
transpose, each with a float32 copy of its values: 1,248 bytes a Criteo row) and 5 bytes a bucket of
``features`` (finding the buckets reached), bounded by ``baseline_features`` and ``baseline_rows`` whatever the
table's size.

Trained on negatively downsampled rows (``data.negative_sample_rate``), its predictions are corrected as the deep
model's are: ``logit + ln(rate)``, i.e. ``q = p / (p + (1 - p) / rate)``. The evaluation reports the deep model's
lift over it: whether the deep model earns its cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
import scipy.linalg
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
MAX_ITERATIONS = 100  # Newton steps: on 800k Criteo-like rows 5 from fit's start, 3 warm-started, 1 to refine
# The solver stops when the gradient of the mean loss in its coordinates (see _Objective.minimise) has a norm below
# this. On 800k Criteo-like rows 1e-5 stopped at the same point and 1e-4 moved the test AUC by 4e-7; on the tests'
# 24,000 rows the loss is then within 1e-14 of L-BFGS's run to ftol=1e-15 (tests/evaluate/test_baseline.py).
GRADIENT_TOLERANCE = 1e-6
# The grid's points are only compared on their validation logloss, 2e-4 to 3e-3 apart on 800k Criteo-like rows: each
# is fitted to this looser tolerance, then only the chosen one on to GRADIENT_TOLERANCE from there.
GRID_TOLERANCE = 1e-4


class Split(NamedTuple):
    """Rows as :func:`components.data_prep.multislot.read_shards` returns them, with optional per-row weights."""

    labels: np.ndarray
    dense: np.ndarray
    sparse: list[RaggedIds]
    weights: Optional[np.ndarray] = None


@dataclass
class _Features:
    """Rows' sparse features as buckets: the buckets of row ``r`` are ``index[starts[r]:starts[r + 1]]``, from the
    slots ``slots[starts[r]:starts[r + 1]]``."""

    index: np.ndarray
    starts: np.ndarray
    slots: np.ndarray

    @classmethod
    def of(cls, sparse: list[RaggedIds], features: int) -> "_Features":
        rows = len(sparse[0].offsets) - 1
        counts = sum(np.diff(slot.offsets) for slot in sparse)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        index = np.empty(starts[-1], np.int64)
        slots = np.empty(starts[-1], np.min_scalar_type(len(sparse)))
        fill = starts[:-1].copy()
        for number, slot in enumerate(sparse):  # a row's features: its ids of every slot, slot after slot
            per_row = np.diff(slot.offsets)
            row_of = np.repeat(np.arange(rows), per_row)
            within = np.arange(len(slot.values)) - np.repeat(slot.offsets[:-1], per_row)
            at = fill[row_of] + within
            index[at] = slot.values % features
            slots[at] = number
            fill += per_row
        return cls(index, starts, slots)

    def rows(self) -> np.ndarray:
        """The row of each entry of ``index``."""
        return np.repeat(np.arange(len(self.starts) - 1), np.diff(self.starts))


def _columns(buckets: np.ndarray, features: int) -> tuple[np.ndarray, np.ndarray]:
    """``(the sorted buckets reached, the column of each of buckets)``, through a table of ``features`` entries (the
    model's weights are as many): on 800k Criteo rows 10x faster than sorting their 21M entries."""
    reached = np.zeros(features, bool)
    reached[buckets] = True
    column_of_bucket = np.cumsum(reached, dtype=np.int32) - 1
    return np.flatnonzero(reached), column_of_bucket[buckets]


def _design(features: _Features, bucket_columns: np.ndarray, columns: int, dense: np.ndarray
            ) -> scipy.sparse.csr_matrix:
    """The rows as a sparse matrix: a 1 in the column of each of their buckets (``bucket_columns``, of each entry of
    ``features.index``, out of ``columns``: one a bucket the rows reach), then their dense values. A bucket a row
    holds twice counts 2, as in a sum of weights."""
    rows, dense_dim = len(features.starts) - 1, dense.shape[1]
    per_row = np.diff(features.starts) + dense_dim
    indptr = np.concatenate([[0], np.cumsum(per_row)])
    if indptr[-1] >= 1 << 31:
        raise ValueError(f"the baseline's {rows:,} rows hold {indptr[-1]:,} features, more than a sparse matrix "
                         f"of int32 indices can: lower eval.baseline_rows")
    indices = np.empty(indptr[-1], np.int32)
    data = np.ones(indptr[-1])
    bucket_at = np.arange(len(features.index)) + np.repeat(indptr[:-1] - features.starts[:-1], np.diff(features.starts))
    indices[bucket_at] = bucket_columns
    dense_at = (indptr[1:] - dense_dim)[:, None] + np.arange(dense_dim)
    indices[dense_at] = columns + np.arange(dense_dim)
    data[dense_at] = dense
    return scipy.sparse.csr_matrix((data, indices, indptr), shape=(rows, columns + dense_dim))


def _groups(features: _Features, bucket_columns: np.ndarray, columns: int, dense_dim: int) -> np.ndarray:
    """The group of each parameter for :class:`_Objective`: a bucket's slot (of a bucket several slots reach, one of
    them), each dense value its own, the bias its own (the last), numbered from 0 without gaps."""
    slot_of_column = np.empty(columns, np.int64)
    slot_of_column[bucket_columns] = features.slots
    first_other = int(features.slots.max(initial=0)) + 1
    return np.unique(np.concatenate([slot_of_column, first_other + np.arange(dense_dim + 1)]), return_inverse=True)[1]


def _logloss(labels: np.ndarray, logits: np.ndarray, weights: Optional[np.ndarray]) -> float:
    losses = np.logaddexp(0.0, logits) - labels * logits
    return float(np.average(losses, weights=weights))


class _Objective:
    """The mean weighted logloss of the rows plus ``penalty / 2`` times the squared weights (the bias is not
    penalised), of the parameters: the design's columns' weights, then the bias. The objective is the fit's divided
    by the total weight, so the tolerances are those of a mean.

    ``columns``: the bucket of each column of the design (then come the dense values); ``row_weights``: each row's
    weight over ``total_weight``, their sum; ``groups``: the group of each parameter for the solver's coarse
    coordinates (see :meth:`minimise`): a bucket's slot, each dense value its own, the bias its own; numbered from 0
    without gaps."""

    def __init__(self, design: scipy.sparse.csr_matrix, columns: np.ndarray, labels: np.ndarray,
                 row_weights: np.ndarray, total_weight: float, groups: np.ndarray):
        self.design, self.columns, self.labels, self.groups = design, columns, labels, groups
        self.row_weights, self.total_weight = row_weights, total_weight
        # The transpose as a CSR matrix of its own, whose products sum each of its rows where design.T's (CSC) scatter
        # into them: on 800k Criteo-like rows 40 ms against 87-141 a product in float64 (35 against 37-63 in
        # float32), for 16 more bytes a design entry with its float32 copy (bench/results/baseline_fit.md).
        self.transpose = design.T.tocsr()
        # Hessian-vector products only steer the solver's steps (the loss and gradient that accept them are float64):
        # float32 values, sharing the float64 matrices' indices, take half their time a product.
        self.design32, self.transpose32 = (
            scipy.sparse.csr_matrix((matrix.data.astype(np.float32), matrix.indices, matrix.indptr), shape=matrix.shape)
            for matrix in (design, self.transpose))
        squares = scipy.sparse.csr_matrix((np.square(design.data), design.indices, design.indptr), shape=design.shape)
        self.column_squares = np.append(squares.T @ row_weights, row_weights.sum())  # the bias: a column of ones
        self.group_sizes = np.bincount(groups[:-1], minlength=groups[-1] + 1)  # of penalised parameters
        self.group_moments = self._group_moments()
        # The rows' curvatures at the last two points they were taken at, each with its parameters: the solver's
        # Hessian-vector products come at its current point, which the last loss evaluation took unless it refused
        # that point.
        self._recent_curvatures: list[tuple[np.ndarray, np.ndarray]] = []
        self.penalty = 0.0

    @classmethod
    def of(cls, labels: np.ndarray, dense: np.ndarray, sparse: list[RaggedIds], weights: Optional[np.ndarray],
           features: int) -> "_Objective":
        """The objective of the given rows, their ids in ``features`` buckets."""
        rows = _Features.of(sparse, features)
        columns, bucket_columns = _columns(rows.index, features)
        design = _design(rows, bucket_columns, len(columns), dense.astype(np.float64))
        groups = _groups(rows, bucket_columns, len(columns), dense.shape[1])
        total_weight = float(weights.sum()) if weights is not None else float(len(labels))
        row_weights = (weights if weights is not None else np.ones(len(labels))) / total_weight
        return cls(design, columns, labels.astype(np.float64), row_weights, total_weight, groups)

    def _group_moments(self, rows_at_once: int = 100_000) -> np.ndarray:
        """``E[s s']`` over the weighted rows, ``s`` a row's sum of values per group (a Criteo row's: 1 for each
        slot, its dense values, 1 for the bias)."""
        count = self.groups[-1] + 1
        moments = np.zeros((count, count))
        indptr = self.design.indptr
        for first in range(0, self.design.shape[0], rows_at_once):
            last = min(first + rows_at_once, self.design.shape[0])
            entries = slice(indptr[first], indptr[last])
            rows = np.repeat(np.arange(last - first), np.diff(indptr[first:last + 1]))
            sums = np.bincount(rows * count + self.groups[self.design.indices[entries]],
                               weights=self.design.data[entries], minlength=(last - first) * count)
            sums = sums.reshape(last - first, count)
            sums[:, -1] += 1.0
            moments += (sums.T * self.row_weights[first:last]) @ sums
        return moments

    def minimise(self, penalty: float, start: np.ndarray, tolerance: float = GRADIENT_TOLERANCE) -> np.ndarray:
        """The parameters minimising the objective at ``penalty``, from ``start``, to a gradient norm below
        ``tolerance`` in the solver's coordinates.

        Newton's method in a trust region (``trust-ncg``: conjugate gradients on Hessian-vector products) on a
        two-level preconditioned problem. First each parameter is rescaled by the Hessian's diagonal at logits 0
        (``0.25 * sum of its column's squares + penalty``): a bucket's rows range from 1 to ~1e5, so unscaled that
        diagonal spans five orders of magnitude. That leaves the directions that move a whole slot's weights
        together: a row holds one id of each slot, so adding c to every weight of a slot and taking it from the bias
        changes no logit, and only the penalty resists (a slot of 3 buckets at l2 30 on 800k rows: 2e-4 of the
        curvature the rescaling gives the others).
        Coarse coordinates, one per group (:class:`_Objective`), span them, scaled by the exact Hessian of their span
        at logits 0: conjugate gradients then need ~3x fewer products (bench/results/baseline_fit.md). The
        coordinates are the fine ones and the coarse ones together, redundant: a point is ``scale * fine + the
        coarse ones spread over their groups``."""
        self.penalty = penalty
        self._recent_curvatures = []
        diagonal = 0.25 * self.column_squares
        diagonal[:-1] += penalty  # the bias is not penalised
        scale = 1.0 / np.sqrt(diagonal)
        coarse_hessian = 0.25 * self.group_moments + penalty * np.diag(self.group_sizes)
        coarse_basis = scipy.linalg.solve_triangular(np.linalg.cholesky(coarse_hessian), np.eye(len(coarse_hessian)),
                                                     lower=True).T  # L^-T, for the Cholesky factor L L' of it
        fine = len(start)

        def parameters(coordinates: np.ndarray) -> np.ndarray:
            return scale * coordinates[:fine] + (coarse_basis @ coordinates[fine:])[self.groups]

        def along_coordinates(gradient: np.ndarray) -> np.ndarray:  # parameters' transpose
            return np.append(scale * gradient,
                             coarse_basis.T @ np.bincount(self.groups, weights=gradient, minlength=len(coarse_basis)))

        def loss_and_gradient(coordinates: np.ndarray) -> tuple[float, np.ndarray]:
            loss, gradient = self.loss_and_gradient(parameters(coordinates))
            return loss, along_coordinates(gradient)

        def hessian_times(coordinates: np.ndarray, direction: np.ndarray) -> np.ndarray:
            return along_coordinates(self.hessian_times(parameters(coordinates), parameters(direction)))

        result = scipy.optimize.minimize(loss_and_gradient, np.append(start / scale, np.zeros(len(coarse_basis))),
                                         jac=True, hessp=hessian_times, method="trust-ncg",
                                         options={"maxiter": MAX_ITERATIONS, "gtol": tolerance})
        return parameters(result.x)

    def loss_and_gradient(self, parameters: np.ndarray) -> tuple[float, np.ndarray]:
        weights, bias = parameters[:-1], parameters[-1]
        logits = self.design @ weights + bias
        loss = (self.row_weights @ (np.logaddexp(0.0, logits) - self.labels * logits)
                + 0.5 * self.penalty * (weights @ weights))
        probabilities = 1.0 / (1.0 + np.exp(-logits))
        self._remember_curvatures(parameters, probabilities)  # saves hessian_times a product of the design
        error = self.row_weights * (probabilities - self.labels)
        return loss, np.append(self.transpose @ error + self.penalty * weights, error.sum())

    def hessian_times(self, parameters: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """The Hessian at ``parameters`` times ``direction``: ``X' diag(w p (1 - p)) X v + penalty v``, the rows'
        curvatures computed once for the many products the solver takes at one point."""
        along = self._curvatures(parameters) * (self.design32 @ direction[:-1].astype(np.float32) + direction[-1])
        return np.append(self.transpose32 @ along.astype(np.float32) + self.penalty * direction[:-1], along.sum())

    def _curvatures(self, parameters: np.ndarray) -> np.ndarray:
        """Each row's weight times ``p (1 - p)``, its probability's, at ``parameters``."""
        for at, curvatures in self._recent_curvatures:
            if np.array_equal(at, parameters):
                return curvatures
        return self._remember_curvatures(
            parameters, 1.0 / (1.0 + np.exp(-(self.design @ parameters[:-1] + parameters[-1]))))

    def _remember_curvatures(self, parameters: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
        curvatures = self.row_weights * probabilities * (1.0 - probabilities)
        self._recent_curvatures = [(parameters.copy(), curvatures), *self._recent_curvatures[:1]]
        return curvatures


class HashedLogisticRegression:
    def __init__(self, features: int):
        if features < 1:
            raise ValueError(f"the baseline needs at least one feature bucket, got features={features}")
        self.features = features

    # One BLAS thread: the solver's vector operations are too short for OpenBLAS's threads, which spin against each
    # other on a busy machine (a 24,000-row fit took 93 s with them on 2 loaded cores, 3.7 s without).
    @threadpoolctl.threadpool_limits.wrap(limits=1, user_api="blas")
    def fit(self, labels: np.ndarray, dense: np.ndarray, sparse: list[RaggedIds],
            weights: Optional[np.ndarray] = None, *, valid: Optional[Split] = None,
            negative_sample_rate: float = 1.0) -> "HashedLogisticRegression":
        """Fit on the given rows (``weights``: each row's share of the loss); ``l2`` is chosen on ``valid`` when it
        has rows, else :data:`DEFAULT_L2`. ``negative_sample_rate``: the fraction of negatives the rows kept; the
        validation rows and every later prediction are taken as not downsampled."""
        if not 0 < negative_sample_rate <= 1:
            raise ValueError(f"the negative sample rate is a fraction in (0, 1], got {negative_sample_rate}")
        self.logit_shift = math.log(negative_sample_rate)
        self.dense_dim = dense.shape[1]
        self.validation_logloss: dict[float, float] = {}  # of each l2 tried, as corrected predictions score it
        objective = _Objective.of(labels, dense, sparse, weights, self.features)
        start = np.zeros(objective.design.shape[1] + 1)  # the columns' weights, then the bias
        # The bias at the rows' log-odds, its optimum while every weight is 0: on 800k Criteo-like rows the first fit
        # then takes 5 Newton steps instead of 7.
        rate = float(objective.row_weights @ objective.labels)
        if 0 < rate < 1:
            start[-1] = math.log(rate / (1 - rate))
        if valid is None or not len(valid.labels):
            self.l2 = DEFAULT_L2
            self._keep(objective.columns, objective.minimise(self.l2 / objective.total_weight, start))
        else:
            self._fit_along_grid(objective, start, valid)
        return self

    def _fit_along_grid(self, objective: _Objective, start: np.ndarray, valid: Split) -> None:
        """Fit at each l2 of :data:`L2_GRID` in turn, each from the previous fit, to :data:`GRID_TOLERANCE`, until
        the validation logloss stops falling; then the best on to :data:`GRADIENT_TOLERANCE`."""
        valid_features = _Features.of(valid.sparse, self.features)
        best, parameters = None, start
        for l2 in L2_GRID:
            parameters = objective.minimise(l2 / objective.total_weight, parameters, GRID_TOLERANCE)
            self._keep(objective.columns, parameters)
            # Chosen on the validation logloss, not its AUC: logloss is what the fit minimises and it scores the
            # over-confident weights of rare ids that the penalty is there to shrink (AUC, a ranking, is blind to
            # the confidence and to the downsampling correction); on a small validation split it is also the
            # steadier of the two along the grid.
            loss = _logloss(valid.labels, self._logits(valid_features, valid.dense), valid.weights)
            self.validation_logloss[l2] = loss
            if best is not None and loss >= self.validation_logloss[best[0]]:
                break  # past the best: weaker penalties overfit further (and are the slowest to fit)
            best = (l2, parameters)
        self.l2, loose = best
        self._keep(objective.columns, objective.minimise(self.l2 / objective.total_weight, loose))
        self.validation_logloss[self.l2] = _logloss(valid.labels, self._logits(valid_features, valid.dense),
                                                    valid.weights)  # the delivered model's

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
