"""Metrics per group of test rows, what ads teams report beside the overall ones: GAUC and slices.

A row's group is the first id of one of its sparse slots (``eval.group_by``, ``eval.slices``): a user or an ad.
Both need each row's prediction beside its group, so they are computed from the workers' per-row predictions
(:class:`components.checkpoint.format.RowPredictions`) aligned with the test split the evaluation reads, not from
the counts of :mod:`components.metrics` (which keep no row). Everything is a sort and cumulative sums over the rows,
O(n log n) for any number of groups.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import numpy.typing as npt

from components.data_prep.multislot import RaggedIds
from components.metrics import ScoreCounts, binary_metrics_counts

OTHER_SLICE = "other"  # the slice row of every value beyond the top ones


def first_ids(slot: RaggedIds, name: str) -> np.ndarray:
    """Each row's first id of a sparse slot: the row's group. Data prep gives every row a value of every slot (a
    missing one is an id of its own), so a row without one is a broken dataset."""
    empty = np.flatnonzero(np.diff(slot.offsets) == 0)
    if empty.size:
        raise ValueError(f"{empty.size} test rows hold no id of slot {name!r} (e.g. row {int(empty[0])}): every "
                         "row of a prepared dataset has one")
    return slot.values[slot.offsets[:-1]]


def grouped_auc(groups: npt.ArrayLike, labels: npt.ArrayLike, preds: npt.ArrayLike,
                weights: Optional[npt.ArrayLike] = None) -> dict[str, Any]:
    """GAUC: the AUC of each group's rows (ties one half, pairs weighing their rows' weights), averaged over the
    groups weighted by their impressions (rows, or weight). A group whose rows are of one class (or whose positives
    or negatives all weigh 0) has no AUC: it is skipped and counted.

    Returns ``gauc`` (None when no group has both classes), ``gauc_groups`` (the groups averaged),
    ``gauc_skipped_groups`` and ``gauc_skipped_rows``.
    """
    groups, labels, preds = (np.asarray(column).ravel() for column in (groups, labels, preds))
    if not groups.size == labels.size == preds.size:
        raise ValueError(f"groups, labels and preds differ in length: {groups.size}, {labels.size}, {preds.size}")
    if not groups.size:
        return {"gauc": None, "gauc_groups": 0, "gauc_skipped_groups": 0, "gauc_skipped_rows": 0}
    # Unweighted, every sum below is of int64 counts: exact.
    mass = np.ones(labels.size, np.int64) if weights is None else np.asarray(weights, np.float64).ravel()
    order = np.lexsort((preds, groups))
    groups, preds, is_positive, mass = groups[order], preds[order], labels[order] == 1, mass[order]
    # Runs of tied rows (one group, one prediction), and each group's first run.
    run_starts = np.flatnonzero(np.concatenate(([True], (groups[1:] != groups[:-1]) | (preds[1:] != preds[:-1]))))
    run_positives = np.add.reduceat(mass * is_positive, run_starts)
    run_negatives = np.add.reduceat(mass * ~is_positive, run_starts)
    run_groups = groups[run_starts]
    opens_group = np.concatenate(([True], run_groups[1:] != run_groups[:-1]))
    first_runs = np.flatnonzero(opens_group)
    negatives_before = np.cumsum(run_negatives) - run_negatives
    # The negatives of the run's own group predicted below it.
    negatives_below = negatives_before - negatives_before[first_runs][np.cumsum(opens_group) - 1]
    doubled_wins = np.add.reduceat(run_positives * (2 * negatives_below + run_negatives), first_runs)
    positives, negatives = np.add.reduceat(run_positives, first_runs), np.add.reduceat(run_negatives, first_runs)
    rows = np.diff(np.concatenate((run_starts[first_runs], [groups.size])))
    scored = (positives > 0) & (negatives > 0)
    impressions = (positives + negatives)[scored] if weights is not None else rows[scored]
    aucs = doubled_wins[scored] / (2.0 * positives[scored] * negatives[scored])
    return {"gauc": float(np.sum(impressions * aucs) / np.sum(impressions)) if scored.any() else None,
            "gauc_groups": int(scored.sum()), "gauc_skipped_groups": int((~scored).sum()),
            "gauc_skipped_rows": int(rows[~scored].sum())}


def slice_metrics(values: npt.ArrayLike, labels: npt.ArrayLike, preds: npt.ArrayLike, top: int,
                  weights: Optional[npt.ArrayLike] = None,
                  uncalibrated: Optional[npt.ArrayLike] = None) -> list[dict[str, Any]]:
    """One row per slice: the ``top`` most frequent ``values`` (by rows; ties by the smaller id), most frequent
    first, then :data:`OTHER_SLICE` for every other row (when there is any).

    Each has ``value``, ``rows``, ``ctr`` (weighted when ``weights`` are given, which adds ``weight``), ``auc``
    (None with one class), ``mean_pred`` and ``calibration`` (mean prediction / CTR; None without clicks), and with
    ``uncalibrated`` (the predictions before the post-hoc calibration) ``uncalibrated_calibration``.
    """
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    values = np.asarray(values).ravel()
    distinct, slice_of_row, rows = np.unique(values, return_inverse=True, return_counts=True)
    ranked = np.lexsort((distinct, -rows))[:top]
    rank_of_slice = np.full(distinct.size, len(ranked))  # every value beyond the top: the "other" row
    rank_of_slice[ranked] = np.arange(len(ranked))
    rank_of_row = rank_of_slice[slice_of_row]
    names: list[Any] = [distinct[index].item() for index in ranked]
    if len(ranked) < distinct.size:
        names.append(OTHER_SLICE)
    labels, preds = np.asarray(labels).ravel(), np.asarray(preds).ravel()
    weights = None if weights is None else np.asarray(weights).ravel()
    uncalibrated = None if uncalibrated is None else np.asarray(uncalibrated).ravel()
    table = []
    for rank, name in enumerate(names):
        chosen = rank_of_row == rank
        row = {"value": name, **_slice_row(ScoreCounts.of(labels[chosen], preds[chosen],
                                                          None if weights is None else weights[chosen]))}
        if uncalibrated is not None:
            before = _slice_row(ScoreCounts.of(labels[chosen], uncalibrated[chosen],
                                               None if weights is None else weights[chosen]))
            row["uncalibrated_calibration"] = before["calibration"]
        table.append(row)
    return table


def _slice_row(counts: ScoreCounts) -> dict[str, Any]:
    positive_weights, negative_weights = counts.weights_by_label
    weight = counts.weight
    ctr = counts.positive_weight / weight if weight else None
    mean_pred = float(np.sum(counts.values * (positive_weights + negative_weights)) / weight) if weight else None
    both_classes = bool(positive_weights.any() and negative_weights.any())
    return {"rows": counts.count, **({"weight": weight} if counts.weighted else {}), "ctr": ctr,
            "auc": binary_metrics_counts(counts)["auc"] if both_classes else None, "mean_pred": mean_pred,
            "calibration": mean_pred / ctr if ctr else None}
