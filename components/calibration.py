"""Calibrations of a model's predictions, fitted on held-out rows: Platt scaling of the network's probability, and the
blend of the network with the baseline (:mod:`components.evaluate.baseline`) that a model blending it in delivers.

Fitted by the workers at every checkpoint on the validation split (:mod:`components.ps.checkpointing`), applied by the
scoring and serving programs (:mod:`components.networks.scoring`); the numpy forms here are the fits and their float64
twins of what the programs compute in float32.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import numpy as np
import numpy.typing as npt

from components.metrics import LOGLOSS_EPS, ScoreCounts, require_both_classes


def fit_platt_counts(counts: ScoreCounts, iterations: int = 50) -> dict[str, float]:
    """Platt scaling: ``p' = sigmoid(a * logit(p) + b)`` with ``a``, ``b`` minimising the logloss of ``p'`` on
    (held-out) labels (Newton's method on the two parameters, a little ridge for separable data). Each value's
    rows weigh in by their counts (their weights), so the fit is the one on the rows."""
    require_both_classes(counts)
    logit = _logit(counts.values)
    positive_weights, negative_weights = counts.weights_by_label
    rows = (positive_weights + negative_weights).astype(np.float64)
    features = np.stack([logit, np.ones_like(logit)], axis=1)
    params = np.array([1.0, 0.0])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(features @ params)))
        gradient = features.T @ (rows * p - positive_weights) + 1e-6 * params
        hessian = (features * (rows * p * (1 - p))[:, None]).T @ features + 1e-6 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        params -= step
        if np.abs(step).max() < 1e-10:
            break
    return {"method": "platt", "a": float(params[0]), "b": float(params[1])}


def fit_blend(logits: np.ndarray, labels: np.ndarray, weights: Optional[np.ndarray] = None,
              all_reduce: Callable[[np.ndarray], np.ndarray] = lambda sums: sums,
              iterations: int = 50) -> Optional[dict[str, float]]:
    """The blend of a network with the baseline: ``p = sigmoid(a * n + c * r + b)`` with ``a``, ``b``, ``c``
    minimising the (weighted) logloss on held-out rows, ``logits`` ``[rows, 2]`` holding each row's network logit
    ``n`` and baseline logit ``r``. Newton's method from ``(a, b, c) = (1, 0, 0)`` (the network alone), a little
    ridge for separable data, as :func:`fit_platt_counts`.

    The rows may be spread over processes: each passes its own and an ``all_reduce`` summing arrays across them;
    the gradient and Hessian are sums over rows, so every process takes the same steps and returns the same blend.
    None when no process holds rows of both classes."""
    labels = np.asarray(labels, np.float64).ravel()
    weights = np.ones_like(labels) if weights is None else np.asarray(weights, np.float64).ravel()
    features = np.column_stack([np.asarray(logits, np.float64).reshape(-1, 2), np.ones_like(labels)])  # n, r, 1
    positives, total = all_reduce(np.array([weights @ labels, weights.sum()]))
    if not 0 < positives < total:
        return None
    params = np.array([1.0, 0.0, 0.0])  # a, c, b
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(features @ params)))
        sums = all_reduce(np.concatenate([features.T @ (weights * (p - labels)),
                                          ((features * (weights * p * (1 - p))[:, None]).T @ features).ravel()]))
        gradient, hessian = sums[:3] / total + 1e-6 * params, sums[3:].reshape(3, 3) / total + 1e-6 * np.eye(3)
        step = np.linalg.solve(hessian, gradient)
        params -= step
        if np.abs(step).max() < 1e-10:
            break
    return {"method": "blend", "a": float(params[0]), "c": float(params[1]), "b": float(params[2])}


def blended_probability(logits: np.ndarray, blend: Optional[Mapping[str, float]]) -> np.ndarray:
    """float32 ``sigmoid(a * n + c * r + b)`` of ``logits`` ``[rows, 2]`` (each row's network logit ``n`` and
    baseline logit ``r``) through a blend of :func:`fit_blend`; the network's own probability when ``blend`` is None.
    Computed in float64; the served program computes it in float32, so the two can differ in the last float32
    place."""
    logits = np.asarray(logits, np.float64).reshape(-1, 2)
    combined = logits[:, 0] if blend is None else blend["a"] * logits[:, 0] + blend["c"] * logits[:, 1] + blend["b"]
    return (1.0 / (1.0 + np.exp(-combined))).astype(np.float32)


def fit_platt(labels: npt.ArrayLike, preds: npt.ArrayLike, iterations: int = 50,
              weights: Optional[npt.ArrayLike] = None) -> dict[str, float]:
    """:func:`fit_platt_counts` of rows."""
    return fit_platt_counts(ScoreCounts.of(labels, preds, weights), iterations)


def calibrate(preds: npt.ArrayLike, calibration: Mapping[str, Any]) -> np.ndarray:
    """``preds`` through a calibration of :func:`fit_platt` (``{"method": "platt", "a", "b"}``), as float32, the
    served model's precision: ``sigmoid(a * logit(p) + b)``, the logit clipped as the fit clipped it. Computed in
    float64 from the probabilities; the served program computes it in float32 from its logits, so the two can differ
    in the last float32 place. For counts: ``counts.mapped(lambda values: calibrate(values, calibration))``."""
    if calibration.get("method") != "platt":
        raise ValueError(f"unknown calibration method {calibration.get('method')!r}; only 'platt' is applied")
    logit = _logit(np.asarray(preds, dtype=np.float64))
    return (1.0 / (1.0 + np.exp(-(float(calibration["a"]) * logit + float(calibration["b"]))))).astype(np.float32)


def _logit(preds: np.ndarray) -> np.ndarray:
    clipped = np.clip(preds, LOGLOSS_EPS, 1.0 - LOGLOSS_EPS)
    return np.log(clipped) - np.log1p(-clipped)
