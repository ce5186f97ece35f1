"""Binary-classification metrics for CTR evaluation, in plain numpy.

Everything here is exact and O(n log n), so it can run on the full evaluation
set (tens of millions of rows) inside the evaluate component without Paddle:
predictions are grouped by distinct value once and AUC, the ROC curve and the
calibration bins are computed from per-group counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

# Paddle emits float32 probabilities, whose resolution just below 1.0 is ~6e-8;
# clipping tighter than that would charge a saturated wrong prediction ~35 nats
# for a precision the model output does not have.
LOGLOSS_EPS = 1e-7


def binary_metrics(labels: npt.ArrayLike, preds: npt.ArrayLike) -> dict[str, Any]:
    """Summarise predicted click probabilities against 0/1 labels.

    Returns a dict with ``auc`` (exact ROC AUC, ties count one half),
    ``logloss`` (mean negative log-likelihood, probabilities clipped to
    ``[LOGLOSS_EPS, 1 - LOGLOSS_EPS]``), ``calibration`` (mean prediction /
    observed CTR; 1.0 is perfectly calibrated on average), ``mean_pred``,
    ``observed_ctr``, ``count`` and ``positives``.

    Raises ValueError for empty or mismatched inputs, labels other than 0/1,
    labels of a single class, or predictions outside [0, 1] or NaN.
    """
    label_array, pred_array = _validated(labels, preds, require_both_classes=True)
    count = label_array.size
    positives = int(np.count_nonzero(label_array))
    observed_ctr = positives / count
    mean_pred = float(np.mean(pred_array))

    clipped = np.clip(pred_array, LOGLOSS_EPS, 1.0 - LOGLOSS_EPS)
    logloss = -float(np.mean(np.where(label_array, np.log(clipped), np.log1p(-clipped))))
    _, positives_per_value, negatives_per_value = _grouped_label_counts(label_array, pred_array)

    return {
        "auc": _auc_from_groups(positives_per_value, negatives_per_value),
        "logloss": logloss,
        "calibration": mean_pred / observed_ctr,
        "mean_pred": mean_pred,
        "observed_ctr": observed_ctr,
        "count": count,
        "positives": positives,
    }


def roc_curve(
    labels: npt.ArrayLike, preds: npt.ArrayLike, max_points: int = 200
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC curve as ``(fpr, tpr, thresholds)``, at most ``max_points`` long.

    Point ``i`` is the rate of negatives / positives with ``pred >= thresholds[i]``.
    The curve starts at (0, 0) with threshold ``+inf`` (nothing predicted
    positive) and ends at (1, 1) with the smallest prediction; fpr and tpr are
    non-decreasing and thresholds strictly decreasing. Downsampling keeps
    points evenly spaced along the curve (by fpr + tpr) and always keeps both
    endpoints, so the plot keeps its shape however many rows there are.
    """
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2 (the two endpoints), got {max_points}")
    label_array, pred_array = _validated(labels, preds, require_both_classes=True)
    distinct_preds, positives_per_value, negatives_per_value = _grouped_label_counts(
        label_array, pred_array
    )

    # Walk thresholds from the highest prediction down; prepend the empty selection.
    true_positives = np.concatenate(([0], np.cumsum(positives_per_value[::-1])))
    false_positives = np.concatenate(([0], np.cumsum(negatives_per_value[::-1])))
    tpr = true_positives / true_positives[-1]
    fpr = false_positives / false_positives[-1]
    thresholds = np.concatenate(([np.inf], distinct_preds[::-1]))

    if tpr.size > max_points:
        # fpr + tpr rises monotonically from 0 to exactly 2, so equal steps in it
        # spread the kept points evenly over the drawn curve.
        distance_along_curve = fpr + tpr
        targets = np.linspace(0.0, 2.0, max_points)
        kept = np.searchsorted(distance_along_curve, targets, side="left")
        kept = np.unique(np.concatenate(([0], np.minimum(kept, tpr.size - 1), [tpr.size - 1])))
        fpr, tpr, thresholds = fpr[kept], tpr[kept], thresholds[kept]
    return fpr, tpr, thresholds


CONFUSION_CLASSES = ("no click", "click")


def confusion_matrix(labels: npt.ArrayLike, preds: npt.ArrayLike, threshold: float) -> list[list[int]]:
    """Counts by actual class (rows) and predicted class (columns), in :data:`CONFUSION_CLASSES` order: a
    prediction ``>= threshold`` is a predicted click, as on the ROC curve. ``[[tn, fp], [fn, tp]]``."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be a probability in (0, 1), got {threshold}")
    label_array, pred_array = _validated(labels, preds, require_both_classes=False)
    predicted = pred_array >= threshold
    return [[int(np.count_nonzero(~label_array & ~predicted)), int(np.count_nonzero(~label_array & predicted))],
            [int(np.count_nonzero(label_array & ~predicted)), int(np.count_nonzero(label_array & predicted))]]


def calibration_bins(
    labels: npt.ArrayLike, preds: npt.ArrayLike, bins: int = 10
) -> list[dict[str, float | int]]:
    """Mean prediction vs observed positive rate in equal-count bins of prediction.

    Rows are sorted by prediction and cut into ``bins`` chunks of (nearly) equal
    size, lowest predictions first, so every bin has enough rows to be
    meaningful even when predictions are heavily skewed; tied predictions may
    straddle two bins. Fewer bins are returned when there are fewer rows.
    Each dict has ``bin``, ``count``, ``pred_min``, ``pred_max``, ``mean_pred``
    and ``observed_rate``. Single-class labels are allowed here.
    """
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    label_array, pred_array = _validated(labels, preds, require_both_classes=False)
    order = np.argsort(pred_array, kind="stable")
    sorted_preds = pred_array[order]
    sorted_labels = label_array[order]

    rows: list[dict[str, float | int]] = []
    bin_count = min(bins, sorted_preds.size)
    for index, (bin_preds, bin_labels) in enumerate(
        zip(np.array_split(sorted_preds, bin_count), np.array_split(sorted_labels, bin_count))
    ):
        rows.append(
            {
                "bin": index,
                "count": int(bin_preds.size),
                "pred_min": float(bin_preds[0]),
                "pred_max": float(bin_preds[-1]),
                "mean_pred": float(np.mean(bin_preds)),
                "observed_rate": float(np.mean(bin_labels)),
            }
        )
    return rows


def expected_calibration_error(labels: npt.ArrayLike, preds: npt.ArrayLike, bins: int = 10) -> float:
    """Mean |mean prediction - observed rate| over the equal-count bins of :func:`calibration_bins`, weighted
    by the rows in each: 0 for a perfectly calibrated model."""
    rows = calibration_bins(labels, preds, bins)
    total = sum(row["count"] for row in rows)
    return float(sum(row["count"] * abs(row["mean_pred"] - row["observed_rate"]) for row in rows) / total)


def fit_platt(labels: npt.ArrayLike, preds: npt.ArrayLike, iterations: int = 50) -> dict[str, float]:
    """Platt scaling: ``p' = sigmoid(a * logit(p) + b)`` with ``a``, ``b`` minimising the logloss of ``p'`` on
    (held-out) ``labels`` (Newton's method on the two parameters, a little ridge for separable data)."""
    label_array, pred_array = _validated(labels, preds, require_both_classes=True)
    logit = _logit(pred_array)
    features = np.stack([logit, np.ones_like(logit)], axis=1)
    params = np.array([1.0, 0.0])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(features @ params)))
        gradient = features.T @ (p - label_array) + 1e-6 * params
        hessian = (features * (p * (1 - p))[:, None]).T @ features + 1e-6 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        params -= step
        if np.abs(step).max() < 1e-10:
            break
    return {"method": "platt", "a": float(params[0]), "b": float(params[1])}


def _logit(preds: np.ndarray) -> np.ndarray:
    clipped = np.clip(preds, LOGLOSS_EPS, 1.0 - LOGLOSS_EPS)
    return np.log(clipped) - np.log1p(-clipped)


def _validated(
    labels: npt.ArrayLike, preds: npt.ArrayLike, *, require_both_classes: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Check inputs and return them as a boolean label vector and float64 predictions."""
    label_array = _as_vector(labels, "labels")
    pred_array = _as_vector(preds, "preds").astype(np.float64, copy=False)
    if label_array.size == 0:
        raise ValueError("labels and preds are empty; metrics need at least one example")
    if label_array.size != pred_array.size:
        raise ValueError(
            f"labels and preds differ in length: {label_array.size} labels vs {pred_array.size} preds"
        )

    is_positive = label_array == 1
    if not np.all(is_positive | (label_array == 0)):
        unexpected = np.unique(label_array[~(is_positive | (label_array == 0))])[:5]
        raise ValueError(f"labels must be 0 or 1; found {unexpected.tolist()}")
    if require_both_classes:
        positives = int(np.count_nonzero(is_positive))
        if positives in (0, is_positive.size):
            only_class = 1 if positives else 0
            raise ValueError(
                f"all {is_positive.size} labels are {only_class}; "
                "AUC is undefined without both positive and negative examples"
            )

    not_probability = np.isnan(pred_array) | (pred_array < 0.0) | (pred_array > 1.0)
    if np.any(not_probability):
        first_bad = int(np.flatnonzero(not_probability)[0])
        raise ValueError(
            f"preds must be probabilities in [0, 1] without NaN; "
            f"{int(np.count_nonzero(not_probability))} are not, e.g. preds[{first_bad}] = "
            f"{pred_array[first_bad]}"
        )
    return is_positive, pred_array


def _as_vector(values: npt.ArrayLike, name: str) -> np.ndarray:
    """Accept 1-D input or an (n, 1) column, as Paddle fetches come back."""
    array = np.asarray(values)
    if array.ndim == 2 and array.shape[1] == 1:
        return array[:, 0]
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D or an (n, 1) column, got shape {array.shape}")
    return array


def _grouped_label_counts(
    is_positive: np.ndarray, preds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct predictions (ascending) with the positives and negatives at each."""
    distinct_preds, group_of_row, rows_per_value = np.unique(
        preds, return_inverse=True, return_counts=True
    )
    positives_per_value = np.bincount(group_of_row[is_positive], minlength=distinct_preds.size)
    return distinct_preds, positives_per_value, rows_per_value - positives_per_value


def _auc_from_groups(positives_per_value: np.ndarray, negatives_per_value: np.ndarray) -> float:
    """Mann-Whitney AUC: P(pred of a positive > pred of a negative), ties counted 1/2.

    Summed in int64 as twice the pair count, so it is exact (no float rank sums)
    for up to ~4e9 rows.
    """
    negatives_below = np.cumsum(negatives_per_value) - negatives_per_value
    doubled_wins = int(np.sum(positives_per_value * (2 * negatives_below + negatives_per_value)))
    positives = int(positives_per_value.sum())
    negatives = int(negatives_per_value.sum())
    return doubled_wins / (2 * positives * negatives)
