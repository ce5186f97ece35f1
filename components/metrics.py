"""Binary-classification metrics for CTR evaluation, in plain numpy.

Every metric is computed from :class:`ScoreCounts`, the distinct predicted values with the positive and negative
labels at each. That form is exact (AUC with ties counted one half, logloss as a count-weighted sum) and merges
exactly by summing counts, so each worker can count its share of a split and the evaluation scores their union; its
size is bounded by the split's rows. Rows may carry weights (``data.weight_column``): the counts then also sum the
weights, and every metric but the confusion matrix weighs each row by its weight (a row of weight 2 counts as the
row twice); unweighted counts stay integers, exact. ``f_counts(counts, ...)`` is a metric's implementation and
``f(labels, preds, ..., weights=None)`` the same metric of rows, which it counts first. Everything is O(n log n), so
it runs on the full evaluation set (tens of millions of rows) without Paddle. Metrics per group of rows (GAUC,
slices) are :mod:`components.evaluate.groups`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np
import numpy.typing as npt

# Paddle emits float32 probabilities, whose resolution just below 1.0 is ~6e-8;
# clipping tighter than that would charge a saturated wrong prediction ~35 nats
# for a precision the model output does not have.
LOGLOSS_EPS = 1e-7


@dataclass(eq=False)
class ScoreCounts:
    """Predictions grouped by value: ``positives[i]`` rows labelled 1 and ``negatives[i]`` labelled 0 were predicted
    ``values[i]``. ``values`` are distinct and ascending, in float64, which holds float32 predictions exactly; every
    value is the prediction of at least one row. Weighted rows also sum their weights there: ``positive_weights[i]``
    and ``negative_weights[i]`` (both None: every row weighs 1). Checked on construction, so a loaded file is checked
    too."""

    values: np.ndarray
    positives: np.ndarray
    negatives: np.ndarray
    positive_weights: Optional[np.ndarray] = None
    negative_weights: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        self.values = np.asarray(self.values, dtype=np.float64)
        self.positives = np.asarray(self.positives).astype(np.int64, casting="same_kind", copy=False)
        self.negatives = np.asarray(self.negatives).astype(np.int64, casting="same_kind", copy=False)
        if not self.values.ndim == 1 or not self.values.shape == self.positives.shape == self.negatives.shape:
            raise ValueError(f"values, positives and negatives must be 1-D and of one length, got shapes "
                             f"{self.values.shape}, {self.positives.shape} and {self.negatives.shape}")
        if np.any(~((self.values >= 0.0) & (self.values <= 1.0))):
            raise ValueError("values must be probabilities in [0, 1] without NaN")
        if np.any(np.diff(self.values) <= 0.0):
            raise ValueError("values must be distinct and ascending")
        if np.any((self.positives < 0) | (self.negatives < 0) | (self.positives + self.negatives == 0)):
            raise ValueError("counts must be non-negative, with at least one row at each value")
        if (self.positive_weights is None) != (self.negative_weights is None):
            raise ValueError("positive_weights and negative_weights go together: both arrays or both None")
        if self.weighted:
            self.positive_weights = np.asarray(self.positive_weights, dtype=np.float64)
            self.negative_weights = np.asarray(self.negative_weights, dtype=np.float64)
            if not self.values.shape == self.positive_weights.shape == self.negative_weights.shape:
                raise ValueError(f"the weights must be of the values' shape {self.values.shape}, got "
                                 f"{self.positive_weights.shape} and {self.negative_weights.shape}")
            if np.any(~((self.positive_weights >= 0) & (self.negative_weights >= 0) &
                        np.isfinite(self.positive_weights + self.negative_weights))):
                raise ValueError("weights must be finite and non-negative")

    @classmethod
    def of(cls, labels: npt.ArrayLike, preds: npt.ArrayLike, weights: Optional[npt.ArrayLike] = None
           ) -> "ScoreCounts":
        """The counts of rows: 0/1 ``labels``, their predicted probabilities ``preds`` and, when given, their
        ``weights`` (1-D or ``(n, 1)`` columns). No rows give empty counts: a worker may hold no rows of a split.

        Raises ValueError for mismatched lengths, labels other than 0/1, predictions outside [0, 1] or NaN, or
        weights that are negative or not finite.
        """
        is_positive, pred_array = _validated(labels, preds)
        values, value_of_row, rows_per_value = np.unique(pred_array, return_inverse=True, return_counts=True)
        positives = np.bincount(value_of_row[is_positive], minlength=values.size)
        if weights is None:
            return cls(values, positives, rows_per_value - positives)
        weight_array = _validated_weights(weights, pred_array.size)
        return cls(values, positives, rows_per_value - positives,
                   np.bincount(value_of_row[is_positive], weight_array[is_positive], minlength=values.size),
                   np.bincount(value_of_row[~is_positive], weight_array[~is_positive], minlength=values.size))

    @classmethod
    def merge(cls, parts: Iterable["ScoreCounts"]) -> "ScoreCounts":
        """The counts of all the parts' rows together: the union of their values, counts (and weights) summed; the
        counts exactly. Weighted if any part is (an unweighted part's rows weigh 1)."""
        parts = list(parts)
        label_weights = [part.weights_by_label for part in parts] if any(part.weighted for part in parts) else None
        return cls._regrouped(
            np.concatenate([np.empty(0), *(part.values for part in parts)]),
            np.concatenate([np.empty(0, np.int64), *(part.positives for part in parts)]),
            np.concatenate([np.empty(0, np.int64), *(part.negatives for part in parts)]),
            *((np.concatenate([np.empty(0), *(positive for positive, _ in label_weights)]),
               np.concatenate([np.empty(0), *(negative for _, negative in label_weights)])) if label_weights else ()))

    def mapped(self, transform: Callable[[np.ndarray], npt.ArrayLike]) -> "ScoreCounts":
        """The counts of the rows' predictions after ``transform`` (elementwise, e.g. a calibration; it need not be
        monotone): values that coincide after it are merged, and the values sorted again."""
        transformed = np.asarray(transform(self.values), dtype=np.float64)
        if transformed.shape != self.values.shape:
            raise ValueError(f"transform changed the shape of the values: {self.values.shape} -> "
                             f"{transformed.shape}; it must map each value to one")
        return self._regrouped(transformed, self.positives, self.negatives,
                               *((self.positive_weights, self.negative_weights) if self.weighted else ()))

    @property
    def weighted(self) -> bool:
        """Whether the rows carry weights (else each weighs 1)."""
        return self.positive_weights is not None

    @property
    def count(self) -> int:
        """Rows counted (whatever their weights)."""
        return int(self.positives.sum() + self.negatives.sum())

    @property
    def positive_count(self) -> int:
        """Rows labelled 1 (whatever their weights)."""
        return int(self.positives.sum())

    @property
    def weights_by_label(self) -> tuple[np.ndarray, np.ndarray]:
        """``(weight of the rows labelled 1, of those labelled 0)`` at each value: what every weighted metric sums.
        Unweighted, the row counts themselves (int64, so those metrics stay exact)."""
        if self.weighted:
            return self.positive_weights, self.negative_weights
        return self.positives, self.negatives

    @property
    def weight(self) -> int | float:
        """The rows' total weight: :attr:`count` when unweighted."""
        return float(self.positive_weights.sum() + self.negative_weights.sum()) if self.weighted else self.count

    @property
    def positive_weight(self) -> int | float:
        """The total weight of the rows labelled 1: :attr:`positive_count` when unweighted."""
        return float(self.positive_weights.sum()) if self.weighted else self.positive_count

    def save(self, path: str | os.PathLike) -> None:
        """Write as an ``.npz`` at ``path``, atomically (a reader never sees half a file)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        weights = {"positive_weights": self.positive_weights, "negative_weights": self.negative_weights} \
            if self.weighted else {}
        with open(tmp, "wb") as f:  # a file object: np.savez would add ".npz" to a name
            np.savez(f, values=self.values, positives=self.positives, negatives=self.negatives, **weights)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ScoreCounts":
        with np.load(path) as saved:
            weights = (saved["positive_weights"], saved["negative_weights"]) \
                if "positive_weights" in saved.files else ()
            return cls(saved["values"], saved["positives"], saved["negatives"], *weights)

    @classmethod
    def _regrouped(cls, values: np.ndarray, *per_value: np.ndarray) -> "ScoreCounts":
        """Counts (and weights) at values that may repeat and be unsorted, summed per distinct value."""
        if values.size == 0:
            return cls(values, *per_value)
        order = np.argsort(values, kind="stable")
        values = values[order]
        starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
        return cls(values[starts], *(np.add.reduceat(column[order], starts) for column in per_value))


def binary_metrics_counts(counts: ScoreCounts) -> dict[str, Any]:
    """Summarise predicted click probabilities against 0/1 labels.

    Returns a dict with ``auc`` (exact ROC AUC, ties count one half),
    ``logloss`` (mean negative log-likelihood, probabilities clipped to
    ``[LOGLOSS_EPS, 1 - LOGLOSS_EPS]``), ``ne`` (normalized entropy: the logloss
    over the entropy of the observed CTR, the logloss of always predicting it;
    below 1 is better than that), ``calibration`` (mean prediction / observed
    CTR; 1.0 is perfectly calibrated on average), ``mean_pred``,
    ``observed_ctr``, ``count`` (rows) and ``positives`` (rows labelled 1).
    Weighted counts weigh every mean and rate by the rows' weights and add
    ``weight`` and ``positive_weight``, the totals.

    Raises ValueError for empty counts or labels of a single class.
    """
    require_both_classes(counts)
    positive_weights, negative_weights = counts.weights_by_label
    weight = counts.weight
    observed_ctr = counts.positive_weight / weight
    mean_pred = float(np.sum(counts.values * (positive_weights + negative_weights)) / weight)
    clipped = np.clip(counts.values, LOGLOSS_EPS, 1.0 - LOGLOSS_EPS)
    logloss = -float(np.sum(positive_weights * np.log(clipped) + negative_weights * np.log1p(-clipped)) / weight)
    base_rate_entropy = -(observed_ctr * math.log(observed_ctr) + (1 - observed_ctr) * math.log1p(-observed_ctr))
    measured = {
        "auc": _auc(counts),
        "logloss": logloss,
        "ne": logloss / base_rate_entropy,
        "calibration": mean_pred / observed_ctr,
        "mean_pred": mean_pred,
        "observed_ctr": observed_ctr,
        "count": counts.count,
        "positives": counts.positive_count,
    }
    if counts.weighted:
        measured.update(weight=weight, positive_weight=counts.positive_weight)
    return measured


def binary_metrics(labels: npt.ArrayLike, preds: npt.ArrayLike,
                   weights: Optional[npt.ArrayLike] = None) -> dict[str, Any]:
    """:func:`binary_metrics_counts` of rows; raises ValueError as :meth:`ScoreCounts.of` does, and for no rows or
    labels of a single class."""
    return binary_metrics_counts(ScoreCounts.of(labels, preds, weights))


def roc_curve_counts(counts: ScoreCounts, max_points: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC curve as ``(fpr, tpr, thresholds)``, at most ``max_points`` long.

    Point ``i`` is the rate (the share of the weight) of negatives / positives with ``pred >= thresholds[i]``.
    The curve starts at (0, 0) with threshold ``+inf`` (nothing predicted
    positive) and ends at (1, 1) with the smallest prediction; fpr and tpr are
    non-decreasing and thresholds strictly decreasing. Downsampling keeps
    points evenly spaced along the curve (by fpr + tpr) and always keeps both
    endpoints, so the plot keeps its shape however many rows there are.
    """
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2 (the two endpoints), got {max_points}")
    require_both_classes(counts)

    # Walk thresholds from the highest prediction down; prepend the empty selection.
    positive_weights, negative_weights = counts.weights_by_label
    true_positives = np.concatenate(([0], np.cumsum(positive_weights[::-1])))
    false_positives = np.concatenate(([0], np.cumsum(negative_weights[::-1])))
    tpr = true_positives / true_positives[-1]
    fpr = false_positives / false_positives[-1]
    thresholds = np.concatenate(([np.inf], counts.values[::-1]))

    if tpr.size > max_points:
        # fpr + tpr rises monotonically from 0 to exactly 2, so equal steps in it
        # spread the kept points evenly over the drawn curve.
        distance_along_curve = fpr + tpr
        targets = np.linspace(0.0, 2.0, max_points)
        kept = np.searchsorted(distance_along_curve, targets, side="left")
        kept = np.unique(np.concatenate(([0], np.minimum(kept, tpr.size - 1), [tpr.size - 1])))
        fpr, tpr, thresholds = fpr[kept], tpr[kept], thresholds[kept]
    return fpr, tpr, thresholds


def roc_curve(
    labels: npt.ArrayLike, preds: npt.ArrayLike, max_points: int = 200, weights: Optional[npt.ArrayLike] = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`roc_curve_counts` of rows."""
    return roc_curve_counts(ScoreCounts.of(labels, preds, weights), max_points)


CONFUSION_CLASSES = ("no click", "click")


def confusion_matrix_counts(counts: ScoreCounts, threshold: float) -> list[list[int]]:
    """Counts by actual class (rows) and predicted class (columns), in :data:`CONFUSION_CLASSES` order: a
    prediction ``>= threshold`` is a predicted click, as on the ROC curve. ``[[tn, fp], [fn, tp]]``, of rows
    whatever their weights (what the KFP artifact shows is a matrix of examples)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be a probability in (0, 1), got {threshold}")
    _require_rows(counts)
    predicted = counts.values >= threshold
    return [[int(counts.negatives[~predicted].sum()), int(counts.negatives[predicted].sum())],
            [int(counts.positives[~predicted].sum()), int(counts.positives[predicted].sum())]]


def confusion_matrix(labels: npt.ArrayLike, preds: npt.ArrayLike, threshold: float) -> list[list[int]]:
    """:func:`confusion_matrix_counts` of rows (their weights would not count)."""
    return confusion_matrix_counts(ScoreCounts.of(labels, preds), threshold)


def calibration_bins_counts(counts: ScoreCounts, bins: int = 10) -> list[dict[str, float | int]]:
    """Mean prediction vs observed positive rate in equal-count bins of prediction.

    Rows are sorted by prediction and cut into ``bins`` chunks of (nearly) equal
    size, lowest predictions first (the sizes of ``np.array_split``), so every bin
    has enough rows to be meaningful even when predictions are heavily skewed.
    Tied predictions may straddle two bins; their labels are then shared in
    proportion to the rows on each side (so the bins do not depend on the rows'
    order, which counts do not keep). Fewer bins are returned when there are
    fewer rows. Each dict has ``bin``, ``count`` (rows), ``pred_min``,
    ``pred_max``, ``mean_pred`` and ``observed_rate``. Single-class labels are
    allowed here. Weighted counts: the bins still hold equal rows, the mean and
    the rate are weighted, each dict adds the bin's ``weight``, and a bin whose
    rows all weigh 0 (nothing to compare) is left out.
    """
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    _require_rows(counts)
    rows_per_value = counts.positives + counts.negatives
    value_ends = np.cumsum(rows_per_value)
    total = int(value_ends[-1])
    bin_count = min(bins, total)
    bin_rows = np.full(bin_count, total // bin_count)
    bin_rows[:total % bin_count] += 1
    bin_ends = np.cumsum(bin_rows)
    bin_starts = bin_ends - bin_rows

    # Cut the sorted rows at every value's end and every bin's end: each piece is rows of one value in one bin.
    piece_ends = np.union1d(value_ends, bin_ends)
    piece_starts = np.concatenate(([0], piece_ends[:-1]))
    piece_rows = piece_ends - piece_starts
    value_of_piece = np.searchsorted(value_ends, piece_starts, side="right")
    bin_of_piece = np.searchsorted(bin_ends, piece_starts, side="right")
    # A piece's rows carry their value's weight per row (1 unweighted) and its positive weight per row.
    positive_weights, negative_weights = counts.weights_by_label
    weight_per_row = ((positive_weights + negative_weights) / rows_per_value)[value_of_piece]
    positive_weight_per_row = (positive_weights / rows_per_value)[value_of_piece]
    bin_weights = np.bincount(bin_of_piece, weights=piece_rows * weight_per_row, minlength=bin_count)
    pred_sums = np.bincount(bin_of_piece, weights=piece_rows * weight_per_row * counts.values[value_of_piece],
                            minlength=bin_count)
    positives = np.bincount(bin_of_piece, weights=piece_rows * positive_weight_per_row, minlength=bin_count)
    pred_min = counts.values[np.searchsorted(value_ends, bin_starts, side="right")]
    pred_max = counts.values[np.searchsorted(value_ends, bin_ends - 1, side="right")]
    return [
        {
            "bin": index,
            "count": int(bin_rows[index]),
            **({"weight": float(bin_weights[index])} if counts.weighted else {}),
            "pred_min": float(pred_min[index]),
            "pred_max": float(pred_max[index]),
            "mean_pred": float(pred_sums[index] / bin_weights[index]),
            "observed_rate": float(positives[index] / bin_weights[index]),
        }
        for index in range(bin_count) if bin_weights[index] > 0
    ]


def calibration_bins(
    labels: npt.ArrayLike, preds: npt.ArrayLike, bins: int = 10, weights: Optional[npt.ArrayLike] = None
) -> list[dict[str, float | int]]:
    """:func:`calibration_bins_counts` of rows."""
    return calibration_bins_counts(ScoreCounts.of(labels, preds, weights), bins)


def expected_calibration_error_counts(counts: ScoreCounts, bins: int = 10) -> float:
    """Mean |mean prediction - observed rate| over the equal-count bins of :func:`calibration_bins_counts`,
    weighted by the rows (the weight) in each: 0 for a perfectly calibrated model."""
    rows = calibration_bins_counts(counts, bins)
    mass = [row.get("weight", row["count"]) for row in rows]
    return float(sum(m * abs(row["mean_pred"] - row["observed_rate"]) for m, row in zip(mass, rows)) / sum(mass))


def expected_calibration_error(labels: npt.ArrayLike, preds: npt.ArrayLike, bins: int = 10,
                               weights: Optional[npt.ArrayLike] = None) -> float:
    """:func:`expected_calibration_error_counts` of rows."""
    return expected_calibration_error_counts(ScoreCounts.of(labels, preds, weights), bins)


def _require_rows(counts: ScoreCounts) -> None:
    if counts.values.size == 0:
        raise ValueError("no predictions: the counts (or labels and preds) are empty; metrics need at least one "
                         "example")


def require_both_classes(counts: ScoreCounts) -> None:
    _require_rows(counts)
    count, positives = counts.count, counts.positive_count
    if positives in (0, count):
        only_class = 1 if positives else 0
        raise ValueError(f"all {count} labels are {only_class}; "
                         "AUC is undefined without both positive and negative examples")
    positive_weights, negative_weights = counts.weights_by_label
    if not (positive_weights.any() and negative_weights.any()):
        raise ValueError(f"the rows labelled {0 if positive_weights.any() else 1} (of {count} rows) all weigh 0; "
                         "AUC is undefined without weight on both positive and negative examples")


def _validated(labels: npt.ArrayLike, preds: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Check inputs and return them as a boolean label vector and float64 predictions."""
    label_array = _as_vector(labels, "labels")
    pred_array = _as_vector(preds, "preds").astype(np.float64, copy=False)
    if label_array.size != pred_array.size:
        raise ValueError(
            f"labels and preds differ in length: {label_array.size} labels vs {pred_array.size} preds"
        )

    is_positive = label_array == 1
    if not np.all(is_positive | (label_array == 0)):
        unexpected = np.unique(label_array[~(is_positive | (label_array == 0))])[:5]
        raise ValueError(f"labels must be 0 or 1; found {unexpected.tolist()}")

    not_probability = np.isnan(pred_array) | (pred_array < 0.0) | (pred_array > 1.0)
    if np.any(not_probability):
        first_bad = int(np.flatnonzero(not_probability)[0])
        raise ValueError(
            f"preds must be probabilities in [0, 1] without NaN; "
            f"{int(np.count_nonzero(not_probability))} are not, e.g. preds[{first_bad}] = "
            f"{pred_array[first_bad]}"
        )
    return is_positive, pred_array


def _validated_weights(weights: npt.ArrayLike, rows: int) -> np.ndarray:
    """Row weights as float64, checked: one per row, finite, non-negative."""
    weight_array = _as_vector(weights, "weights").astype(np.float64, copy=False)
    if weight_array.size != rows:
        raise ValueError(f"weights and preds differ in length: {weight_array.size} weights vs {rows} preds")
    invalid = ~(np.isfinite(weight_array) & (weight_array >= 0))
    if np.any(invalid):
        first_bad = int(np.flatnonzero(invalid)[0])
        raise ValueError(f"weights must be finite and non-negative; {int(np.count_nonzero(invalid))} are not, e.g. "
                         f"weights[{first_bad}] = {weight_array[first_bad]}")
    return weight_array


def _as_vector(values: npt.ArrayLike, name: str) -> np.ndarray:
    """Accept 1-D input or an (n, 1) column, as Paddle fetches come back."""
    array = np.asarray(values)
    if array.ndim == 2 and array.shape[1] == 1:
        return array[:, 0]
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D or an (n, 1) column, got shape {array.shape}")
    return array


def _auc(counts: ScoreCounts) -> float:
    """Mann-Whitney AUC: P(pred of a positive > pred of a negative), ties counted 1/2; of weighted rows, each pair
    weighs the product of its rows' weights.

    Unweighted, summed in int64 as twice the pair count, so it is exact (no float rank sums)
    for up to ~4e9 rows.
    """
    positive_weights, negative_weights = counts.weights_by_label
    negatives_below = np.cumsum(negative_weights) - negative_weights
    # .item(): a Python int from int64 sums, so the products below cannot overflow.
    doubled_wins = np.sum(positive_weights * (2 * negatives_below + negative_weights)).item()
    return doubled_wins / (2 * positive_weights.sum().item() * negative_weights.sum().item())
