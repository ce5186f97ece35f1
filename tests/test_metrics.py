"""Unit tests for components.metrics and components.evaluate.report (no Paddle, no Hydra)."""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest
from kfp.dsl import ClassificationMetrics, Metrics

from components.evaluate.report import (confusion_summary, log_kfp_metrics, write_reliability_png, write_report,
                                        write_report_html,
                                        write_roc_png)
from components.calibration import calibrate, fit_platt, fit_platt_counts
from components.metrics import (LOGLOSS_EPS, ScoreCounts, binary_metrics, binary_metrics_counts, calibration_bins,
                                calibration_bins_counts, confusion_matrix, confusion_matrix_counts,
                                expected_calibration_error, expected_calibration_error_counts, roc_curve,
                                roc_curve_counts)
from tests.conftest import calibrated_reference

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def brute_force_auc(labels: np.ndarray, preds: np.ndarray) -> float:
    """O(n^2) definition: share of (positive, negative) pairs ranked right, ties one half."""
    positive_preds = preds[labels == 1][:, None]
    negative_preds = preds[labels == 0][None, :]
    wins = np.sum(positive_preds > negative_preds) + 0.5 * np.sum(positive_preds == negative_preds)
    return wins / (positive_preds.size * negative_preds.size)


def random_tied_data(seed: int, size: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Predictions on a coarse grid (many ties) with labels correlated to them."""
    rng = np.random.default_rng(seed)
    preds = rng.integers(0, 21, size) / 20.0
    labels = (rng.random(size) < 0.2 + 0.6 * preds).astype(np.int64)
    return labels, preds


def trapezoid_area(fpr: np.ndarray, tpr: np.ndarray) -> float:
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_auc_matches_brute_force_with_ties(seed):
    labels, preds = random_tied_data(seed)
    assert binary_metrics(labels, preds)["auc"] == pytest.approx(brute_force_auc(labels, preds), abs=1e-12)


@pytest.mark.parametrize("seed", [10, 11])
def test_auc_matches_brute_force_with_continuous_float32_preds(seed):
    rng = np.random.default_rng(seed)
    preds = rng.random(500).astype(np.float32)
    labels = (rng.random(500) < preds).astype(np.float32)
    assert binary_metrics(labels, preds)["auc"] == pytest.approx(
        brute_force_auc(labels, preds.astype(np.float64)), abs=1e-12
    )


def test_auc_is_exact_on_millions_of_rows():
    # Few distinct values, so the brute force can run on the value-by-value contingency table.
    rng = np.random.default_rng(7)
    values = np.linspace(0.05, 0.95, 7)
    preds = values[rng.integers(0, values.size, 3_000_000)]
    labels = rng.random(preds.size) < preds
    positives = np.array([np.sum(labels & (preds == v)) for v in values])
    negatives = np.array([np.sum(~labels & (preds == v)) for v in values])
    above = values[:, None] > values[None, :]
    wins = np.sum(positives[:, None] * negatives[None, :] * (above + 0.5 * np.eye(values.size)))
    expected_auc = wins / (positives.sum() * negatives.sum())
    assert binary_metrics(labels, preds)["auc"] == pytest.approx(expected_auc, rel=1e-12)


def test_perfect_and_inverse_predictions():
    labels = np.array([0, 0, 1, 1, 0, 1])
    preds = np.array([0.1, 0.2, 0.8, 0.9, 0.3, 0.7])
    assert binary_metrics(labels, preds)["auc"] == 1.0
    assert binary_metrics(labels, 1.0 - preds)["auc"] == 0.0
    assert binary_metrics(labels, np.full(6, 0.5))["auc"] == 0.5


def test_logloss_calibration_and_counts_by_hand():
    labels = [1, 0, 1, 0]
    preds = [0.9, 0.2, 0.6, 0.0]  # the 0.0 is clipped, not log(0)
    expected_logloss = -(
        math.log(0.9) + math.log(0.8) + math.log(0.6) + math.log(1 - LOGLOSS_EPS)
    ) / 4
    metrics = binary_metrics(labels, preds)
    assert metrics["logloss"] == pytest.approx(expected_logloss, rel=1e-12)
    assert metrics["mean_pred"] == pytest.approx(0.425)
    assert metrics["observed_ctr"] == 0.5
    assert metrics["calibration"] == pytest.approx(0.85)
    assert metrics["count"] == 4 and metrics["positives"] == 2
    assert isinstance(metrics["count"], int) and isinstance(metrics["positives"], int)


def test_saturated_wrong_prediction_costs_the_clipped_amount():
    metrics = binary_metrics([1, 0], [1.0, 1.0])
    assert metrics["logloss"] == pytest.approx(-(math.log(1 - LOGLOSS_EPS) + math.log(LOGLOSS_EPS)) / 2)


def test_column_vectors_as_paddle_returns_them_are_accepted():
    labels, preds = random_tied_data(0, size=50)
    assert binary_metrics(labels[:, None], preds[:, None]) == binary_metrics(labels, preds)


@pytest.mark.parametrize(
    ("labels", "preds", "message"),
    [
        ([], [], "empty"),
        ([0, 1, 1], [0.1, 0.2], "differ in length: 3 labels vs 2 preds"),
        ([1, 1, 1], [0.1, 0.2, 0.3], "all 3 labels are 1; AUC is undefined"),
        ([0, 0], [0.1, 0.2], "all 2 labels are 0"),
        ([0, 1], [0.1, 1.5], r"probabilities in \[0, 1\]"),
        ([0, 1], [-0.1, 0.5], r"preds\[0\] = -0.1"),
        ([0, 1], [float("nan"), 0.5], "without NaN"),
        ([0, 2], [0.1, 0.5], r"labels must be 0 or 1; found \[2\]"),
        ([[0, 1], [1, 0]], [[0.1, 0.2], [0.3, 0.4]], r"1-D or an \(n, 1\) column"),
    ],
)
def test_invalid_input_raises_clear_errors(labels, preds, message):
    with pytest.raises(ValueError, match=message):
        binary_metrics(labels, preds)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roc_curve_endpoints_monotone_and_area_equals_auc(seed):
    labels, preds = random_tied_data(seed)
    fpr, tpr, thresholds = roc_curve(labels, preds, max_points=1000)
    assert (fpr[0], tpr[0]) == (0.0, 0.0) and (fpr[-1], tpr[-1]) == (1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    assert thresholds[0] == np.inf and np.all(np.diff(thresholds) < 0)
    assert thresholds[-1] == preds.min()
    # The trapezoid counts ties as one half, like the rank AUC.
    assert trapezoid_area(fpr, tpr) == pytest.approx(binary_metrics(labels, preds)["auc"], abs=1e-12)


def test_roc_curve_points_are_rates_at_their_threshold():
    labels = np.array([0, 1, 0, 1, 1, 0])
    preds = np.array([0.2, 0.8, 0.5, 0.5, 0.9, 0.1])
    fpr, tpr, thresholds = roc_curve(labels, preds)
    for rate_fp, rate_tp, threshold in zip(fpr, tpr, thresholds):
        selected = preds >= threshold
        assert rate_tp == np.mean(selected[labels == 1])
        assert rate_fp == np.mean(selected[labels == 0])


def test_roc_curve_is_downsampled_keeping_shape():
    rng = np.random.default_rng(3)
    preds = rng.random(20_000)
    labels = (rng.random(preds.size) < preds).astype(int)
    fpr, tpr, thresholds = roc_curve(labels, preds, max_points=50)
    assert 2 < fpr.size <= 50 and fpr.size == tpr.size == thresholds.size
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0) and np.all(np.diff(thresholds) < 0)
    assert trapezoid_area(fpr, tpr) == pytest.approx(binary_metrics(labels, preds)["auc"], abs=2e-3)
    assert roc_curve(labels, preds, max_points=2)[0].tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="max_points must be at least 2"):
        roc_curve(labels, preds, max_points=1)


def test_calibration_bins_are_equal_count_quantiles():
    rng = np.random.default_rng(5)
    preds = rng.random(1000)
    labels = (rng.random(preds.size) < preds).astype(int)
    rows = calibration_bins(labels, preds, bins=10)
    assert [row["bin"] for row in rows] == list(range(10))
    assert [row["count"] for row in rows] == [100] * 10
    sorted_preds = np.sort(preds)
    for row, chunk in zip(rows, np.split(sorted_preds, 10)):
        assert row["mean_pred"] == pytest.approx(chunk.mean())
        assert (row["pred_min"], row["pred_max"]) == (chunk[0], chunk[-1])
        # Labels drawn from the predictions: observed rate tracks mean prediction.
        assert row["observed_rate"] == pytest.approx(row["mean_pred"], abs=0.15)
    assert sum(row["observed_rate"] * row["count"] for row in rows) == labels.sum()


def test_calibration_bins_with_few_rows_and_one_class():
    rows = calibration_bins([0, 0, 0], [0.3, 0.1, 0.2], bins=10)
    assert [(row["count"], row["mean_pred"], row["observed_rate"]) for row in rows] == [
        (1, 0.1, 0.0),
        (1, 0.2, 0.0),
        (1, 0.3, 0.0),
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_confusion_matrix_counts_by_hand_and_agrees_with_the_roc_curve(seed):
    labels, preds = random_tied_data(seed)
    threshold = 0.45
    (tn, fp), (fn, tp) = confusion_matrix(labels, preds, threshold)
    by_hand = [[sum(1 for y, p in zip(labels, preds) if y == actual and (p >= threshold) == predicted)
                for predicted in (False, True)] for actual in (0, 1)]
    assert [[tn, fp], [fn, tp]] == by_hand and tn + fp + fn + tp == labels.size
    # The same rule as the ROC curve's: its point at the lowest threshold >= 0.45 has these rates.
    fpr, tpr, thresholds = roc_curve(labels, preds, max_points=10_000)
    at = np.flatnonzero(thresholds >= threshold)[-1]
    assert (fp / (fp + tn), tp / (tp + fn)) == pytest.approx((fpr[at], tpr[at]))


def test_confusion_matrix_refuses_a_threshold_that_is_not_a_probability():
    with pytest.raises(ValueError, match="threshold"):
        confusion_matrix([0, 1], [0.2, 0.8], 1.0)


@pytest.fixture
def evaluated():
    labels, preds = random_tied_data(1, size=2000)
    metrics = binary_metrics(labels, preds)
    return metrics, roc_curve(labels, preds), calibration_bins(labels, preds, bins=5)


def test_roc_png_is_written(tmp_path, evaluated):
    metrics, (fpr, tpr, _), _ = evaluated
    png = tmp_path / "plots" / "roc.png"
    write_roc_png(png, fpr, tpr, metrics["auc"], reference_auc=0.8)
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5000


def test_markdown_report_contains_numbers(tmp_path, evaluated):
    metrics, _, calibration = evaluated
    report = tmp_path / "report.md"
    write_report(
        report,
        metrics,
        title="Wide&Deep on synthetic CTR",
        reference={"auc": 0.8, "logloss": 0.5},
        calibration=calibration,
        training={"examples_per_s": 123456.78, "wall_time_s[worker]": 61.5, "trainers": 2},
        config_summary={"model": "wide_deep", "lr": 0.001, "sparse_dim": 1000003, "note": "a|b"},
        figures=[("ROC curve", tmp_path / "roc.png")],
        tables=[("Baseline", {"baseline_auc": 0.71, "lift_auc": 0.02}), ("Empty", {})],
    )
    text = report.read_text()
    assert text.startswith("# Wide&Deep on synthetic CTR\n")
    assert f"| ROC AUC | {metrics['auc']:.4f} |" in text
    assert f"| Logloss | {metrics['logloss']:.4f} |" in text
    assert f"| Examples | {metrics['count']:,} |" in text
    assert f"| AUC / reference AUC | {metrics['auc'] / 0.8:.2%} |" in text
    assert "| Reference (Bayes-optimal) logloss | 0.5000 |" in text
    assert f"| {calibration[0]['bin']} | {calibration[0]['count']:,} |" in text
    assert "| Examples per second | 123,456.8 |" in text  # the key as a reader says it
    assert "| wall_time_s[worker] | 61.5 |" in text
    assert "| sparse_dim | 1,000,003 |" in text
    assert "| lr | 0.001 |" in text
    assert "| note | a\\|b |" in text
    assert "![ROC curve](roc.png)" in text
    assert "## Baseline" in text and "| Lift (model AUC - baseline AUC) | 0.02 |" in text and "## Empty" not in text


def test_markdown_report_leaves_out_missing_sections(tmp_path, evaluated):
    metrics, _, _ = evaluated
    report = tmp_path / "report.md"
    write_report(report, metrics, title="Minimal")
    text = report.read_text()
    assert f"{metrics['auc']:.4f}" in text
    for absent in ("Reference", "Calibration by", "## Training", "## Configuration", "![ROC"):
        assert absent not in text


def test_html_report_embeds_png(tmp_path, evaluated):
    metrics, (fpr, tpr, _), calibration = evaluated
    png = tmp_path / "roc.png"
    write_roc_png(png, fpr, tpr, metrics["auc"])
    reliability = tmp_path / "calibration.png"
    write_reliability_png(reliability, calibration, [{**row, "mean_pred": row["observed_rate"]} for row in calibration])
    page = tmp_path / "report.html"
    write_report_html(
        page,
        metrics,
        title="A <model> & run",
        reference={"auc": 0.8},
        calibration=calibration,
        training={"examples_per_s": 1000},
        figures=[("ROC curve", png), ("Reliability", reliability)],
    )
    text = page.read_text()
    assert "<title>A &lt;model&gt; &amp; run</title>" in text
    assert f"<td>{metrics['auc']:.4f}</td>" in text
    encoded = [part.split('"', 1)[0] for part in text.split('src="data:image/png;base64,')[1:]]
    assert [base64.b64decode(e) for e in encoded] == [png.read_bytes(), reliability.read_bytes()]


def test_log_kfp_metrics_fills_real_artifacts(tmp_path, evaluated):
    metrics, (fpr, tpr, thresholds), _ = evaluated
    metrics_artifact = Metrics(name="m", uri=str(tmp_path / "m"))
    classification_artifact = ClassificationMetrics(name="c", uri=str(tmp_path / "c"))
    log_kfp_metrics(
        metrics_artifact, classification_artifact, {**metrics, "model": "wide_deep"}, fpr, tpr, thresholds
    )

    assert metrics_artifact.metadata["auc"] == metrics["auc"]
    assert metrics_artifact.metadata["count"] == float(metrics["count"])
    assert "model" not in metrics_artifact.metadata
    assert all(type(value) is float for value in metrics_artifact.metadata.values())

    points = classification_artifact.metadata["confidenceMetrics"]
    assert len(points) == fpr.size
    assert points[0] == {"confidenceThreshold": 1.0, "recall": 0.0, "falsePositiveRate": 0.0}
    assert points[-1]["recall"] == 1.0 and points[-1]["falsePositiveRate"] == 1.0
    assert [p["confidenceThreshold"] for p in points[1:]] == thresholds[1:].tolist()
    assert all(math.isfinite(value) for p in points for value in p.values())


def test_the_confusion_matrix_reaches_the_kfp_artifact_and_the_report(tmp_path, evaluated):
    metrics, (fpr, tpr, thresholds), _ = evaluated
    labels, preds = random_tied_data(1, size=2000)
    confusion = confusion_summary(confusion_matrix(labels, preds, 0.5), 0.5, "eval.threshold")
    classification = ClassificationMetrics(name="c", uri=str(tmp_path / "c"))
    log_kfp_metrics(Metrics(name="m", uri=str(tmp_path / "m")), classification, metrics, fpr, tpr, thresholds,
                    confusion)
    logged = classification.metadata["confusionMatrix"]
    assert [c["displayName"] for c in logged["annotationSpecs"]] == ["no click", "click"]
    assert [row["row"] for row in logged["rows"]] == confusion["matrix"]
    assert classification.metadata["confusionMatrixThreshold"] == 0.5
    assert len(classification.metadata["confidenceMetrics"]) == fpr.size  # the ROC curve beside it

    (tn, fp), (fn, tp) = confusion["matrix"]
    assert confusion["precision"] == tp / (tp + fp) and confusion["recall"] == tp / (tp + fn)
    write_report(tmp_path / "report.md", metrics, title="t", confusion=confusion)
    text = (tmp_path / "report.md").read_text()
    assert "## Confusion matrix at threshold 0.5000 (eval.threshold)" in text
    assert f"| Actual click | {fn:,} | {tp:,} |" in text and f"| Actual no click | {tn:,} | {fp:,} |" in text
    assert "![ROC curve]" not in text  # no image to link: the KFP Markdown artifact's form


def test_log_kfp_metrics_rejects_non_finite_metric(tmp_path):
    with pytest.raises(ValueError, match="'logloss' is nan"):
        log_kfp_metrics(
            Metrics(name="m", uri=str(tmp_path / "m")),
            ClassificationMetrics(name="c", uri=str(tmp_path / "c")),
            {"logloss": float("nan")},
            [0.0, 1.0],
            [0.0, 1.0],
            [np.inf, 0.0],
        )


def test_platt_scaling_recovers_a_miscalibrated_model():
    rng = np.random.default_rng(0)
    logit = rng.normal(size=100_000)
    labels = (rng.random(logit.size) < 1 / (1 + np.exp(-logit))).astype(int)
    skewed = 1 / (1 + np.exp(-(0.5 * logit + 0.7)))  # too flat and too high
    fitted = fit_platt(labels, skewed)
    assert fitted["method"] == "platt" and fitted["a"] == pytest.approx(2.0, abs=0.05)
    assert fitted["b"] == pytest.approx(-1.4, abs=0.05)
    calibrated = calibrated_reference(skewed, fitted)
    assert expected_calibration_error(labels, calibrated) < 0.01 < expected_calibration_error(labels, skewed)
    assert binary_metrics(labels, calibrated)["calibration"] == pytest.approx(1.0, abs=0.01)
    assert binary_metrics(labels, calibrated)["auc"] == pytest.approx(binary_metrics(labels, skewed)["auc"])


# -- ScoreCounts: the mergeable form every metric is computed from -------------------------------------------------
def tied_float32_data(seed: int, size: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    """float32 predictions, as the workers emit them: a coarse grid (many ties) and a continuous part."""
    rng = np.random.default_rng(seed)
    preds = np.where(rng.random(size) < 0.7, rng.integers(0, 41, size) / 40.0, rng.random(size)).astype(np.float32)
    labels = (rng.random(size) < 0.1 + 0.8 * preds).astype(np.int64)
    return labels, preds


def platt_on_rows(labels: np.ndarray, preds: np.ndarray) -> tuple[float, float]:
    """Platt's Newton iteration row by row (the fit before counts): the reference of the fit on counts."""
    clipped = np.clip(preds.astype(np.float64), LOGLOSS_EPS, 1 - LOGLOSS_EPS)
    features = np.stack([np.log(clipped) - np.log1p(-clipped), np.ones(preds.size)], axis=1)
    params = np.array([1.0, 0.0])
    for _ in range(50):
        p = 1 / (1 + np.exp(-(features @ params)))
        hessian = (features * (p * (1 - p))[:, None]).T @ features + 1e-6 * np.eye(2)
        params -= np.linalg.solve(hessian, features.T @ (p - labels) + 1e-6 * params)
    return float(params[0]), float(params[1])


def assert_same_counts(actual: ScoreCounts, expected: ScoreCounts) -> None:
    for field in ("values", "positives", "negatives"):
        a, e = getattr(actual, field), getattr(expected, field)
        assert a.dtype == e.dtype and np.array_equal(a, e), field


def every_metric(counts: ScoreCounts) -> dict:
    return {"binary": binary_metrics_counts(counts), "roc": [a.tolist() for a in roc_curve_counts(counts, 50)],
            "bins": calibration_bins_counts(counts, 7), "ece": expected_calibration_error_counts(counts, 7),
            "confusion": confusion_matrix_counts(counts, 0.45), "platt": fit_platt_counts(counts)}


def test_counts_hold_each_distinct_float32_prediction_exactly():
    labels, preds = tied_float32_data(0)
    counts = ScoreCounts.of(labels[:, None], preds[:, None])
    assert counts.values.dtype == np.float64 and np.all(np.diff(counts.values) > 0)
    assert np.array_equal(counts.values.astype(np.float32), np.unique(preds))  # no float32 value lost or merged
    assert counts.count == labels.size and counts.positive_count == labels.sum()
    at = np.searchsorted(counts.values, preds.astype(np.float64))
    assert np.array_equal(np.bincount(at, weights=labels), counts.positives)
    assert np.array_equal(np.bincount(at, weights=1 - labels), counts.negatives)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_metric_of_counts_equals_the_metric_of_rows(seed):
    labels, preds = tied_float32_data(seed)
    counts = ScoreCounts.of(labels, preds)
    of_counts = binary_metrics_counts(counts)
    assert of_counts == binary_metrics(labels, preds)
    # Held to the definitions on the rows, not only to the row functions (which count first).
    assert of_counts["auc"] == pytest.approx(brute_force_auc(labels, preds.astype(np.float64)), abs=1e-12)
    clipped = np.clip(preds.astype(np.float64), LOGLOSS_EPS, 1 - LOGLOSS_EPS)
    row_logloss = -np.mean(np.where(labels == 1, np.log(clipped), np.log1p(-clipped)))
    assert of_counts["logloss"] == pytest.approx(row_logloss, abs=1e-12)
    assert of_counts["mean_pred"] == pytest.approx(np.mean(preds.astype(np.float64)), abs=1e-12)
    for rows_result, counts_result in zip(roc_curve(labels, preds, 50), roc_curve_counts(counts, 50)):
        np.testing.assert_array_equal(rows_result, counts_result)
    assert calibration_bins(labels, preds, 7) == calibration_bins_counts(counts, 7)
    assert expected_calibration_error(labels, preds, 7) == expected_calibration_error_counts(counts, 7)
    predicted = preds.astype(np.float64) >= 0.45  # as the metrics compare: the float32 value exactly
    assert confusion_matrix_counts(counts, 0.45) == confusion_matrix(labels, preds, 0.45) == [
        [int(np.sum((labels == 0) & ~predicted)), int(np.sum((labels == 0) & predicted))],
        [int(np.sum((labels == 1) & ~predicted)), int(np.sum((labels == 1) & predicted))]]
    fitted = fit_platt_counts(counts)
    assert fitted == fit_platt(labels, preds)
    assert (fitted["a"], fitted["b"]) == pytest.approx(platt_on_rows(labels, preds), abs=1e-6)


def test_calibration_bins_share_the_labels_of_a_tie_across_bins_by_rows():
    # Sorted rows: 0.5 0.5 0.5 | 0.9 -> bins of two rows; the 0.5 rows (2 of 3 positive) straddle both bins.
    rows = calibration_bins([1, 1, 0, 1], [0.5, 0.5, 0.5, 0.9], bins=2)
    assert [(row["count"], row["pred_min"], row["pred_max"]) for row in rows] == [(2, 0.5, 0.5), (2, 0.5, 0.9)]
    assert [row["observed_rate"] for row in rows] == pytest.approx([2 / 3, (2 / 3 + 1) / 2])
    assert [row["mean_pred"] for row in rows] == pytest.approx([0.5, 0.7])
    assert calibration_bins([0, 1, 1, 1], [0.5, 0.5, 0.5, 0.9], bins=2) == rows  # the rows' order does not matter


@pytest.mark.parametrize("seed", [0, 1])
def test_the_merged_counts_of_any_split_of_the_rows_are_the_counts_of_all_rows(seed):
    labels, preds = tied_float32_data(seed)
    worker = np.random.default_rng(seed).integers(0, 3, labels.size)
    parts = [ScoreCounts.of(labels[worker == w], preds[worker == w]) for w in range(3)]
    merged = ScoreCounts.merge([*parts, ScoreCounts.of([], [])])  # a worker without rows of the split
    whole = ScoreCounts.of(labels, preds)
    assert_same_counts(merged, whole)
    assert every_metric(merged) == every_metric(whole)
    assert_same_counts(ScoreCounts.merge([ScoreCounts.merge(parts[:2]), parts[2]]), whole)  # in any grouping


def test_empty_counts_are_the_identity_of_merge_and_no_metric_scores_them():
    labels, preds = tied_float32_data(0, size=200)
    counts = ScoreCounts.of(labels, preds)
    empty = ScoreCounts.of(np.empty(0), np.empty(0, np.float32))
    assert empty.count == empty.positive_count == 0 and empty.values.size == 0
    assert_same_counts(ScoreCounts.merge([empty, counts, empty]), counts)
    assert_same_counts(ScoreCounts.merge([empty, empty]), empty)
    assert_same_counts(ScoreCounts.merge([]), empty)
    for metric in (binary_metrics_counts, roc_curve_counts, calibration_bins_counts, fit_platt_counts,
                   lambda c: confusion_matrix_counts(c, 0.5)):
        with pytest.raises(ValueError, match="empty"):
            metric(empty)


def test_counts_validate_like_the_row_metrics():
    with pytest.raises(ValueError, match="differ in length"):
        ScoreCounts.of([0, 1], [0.5])
    with pytest.raises(ValueError, match=r"labels must be 0 or 1; found \[2\]"):
        ScoreCounts.of([0, 2], [0.1, 0.5])
    with pytest.raises(ValueError, match="without NaN"):
        ScoreCounts.of([0, 1], [float("nan"), 0.5])
    for values, positives, negatives, message in [([0.2, 0.1], [1, 1], [0, 0], "distinct and ascending"),
                                                  ([0.1, 0.1], [1, 1], [0, 0], "distinct and ascending"),
                                                  ([0.1, 1.5], [1, 1], [0, 0], r"probabilities in \[0, 1\]"),
                                                  ([0.1, 0.2], [1, 0], [0, 0], "at least one row"),
                                                  ([0.1, 0.2], [1, -1], [0, 2], "non-negative"),
                                                  ([0.1, 0.2], [1], [0, 1], "of one length")]:
        with pytest.raises(ValueError, match=message):
            ScoreCounts(np.array(values), np.array(positives), np.array(negatives))
    with pytest.raises(TypeError, match="int64"):
        ScoreCounts(np.array([0.1]), np.array([0.5]), np.array([1]))


def test_counts_survive_a_save_and_load(tmp_path):
    labels, preds = tied_float32_data(3, size=500)
    for name, counts in (("split.npz", ScoreCounts.of(labels, preds)), ("none.npz", ScoreCounts.of([], []))):
        counts.save(tmp_path / name)
        assert_same_counts(ScoreCounts.load(tmp_path / name), counts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["none.npz", "split.npz"]  # no temporary file left


def test_mapped_counts_merge_the_values_a_transform_makes_equal():
    counts = ScoreCounts(np.array([0.1, 0.2, 0.3, 0.4]), np.array([1, 2, 3, 4]), np.array([5, 6, 7, 8]))
    folded = counts.mapped(lambda v: np.where(v < 0.25, 0.6, 0.3))  # not monotone: 0.1, 0.2 -> 0.6; 0.3, 0.4 -> 0.3
    assert_same_counts(folded, ScoreCounts(np.array([0.3, 0.6]), np.array([7, 3]), np.array([15, 11])))
    assert folded.count == counts.count and folded.positive_count == counts.positive_count
    with pytest.raises(ValueError, match="changed the shape"):
        counts.mapped(lambda v: v[:2])


def test_calibrated_counts_are_the_counts_of_the_calibrated_rows():
    labels, preds = tied_float32_data(4)
    calibration = fit_platt(labels, preds)
    calibrated = calibrate(preds, calibration)
    assert calibrated.dtype == np.float32
    np.testing.assert_allclose(calibrated, calibrated_reference(preds, calibration), rtol=1e-6)
    mapped = ScoreCounts.of(labels, preds).mapped(lambda values: calibrate(values, calibration))
    assert_same_counts(mapped, ScoreCounts.of(labels, calibrated))
    with pytest.raises(ValueError, match="unknown calibration method 'isotonic'"):
        calibrate(preds, {"method": "isotonic"})


# -- NE and weighted rows -------------------------------------------------------------------------------------------
def test_ne_of_a_constant_base_rate_predictor_is_one():
    labels, _ = tied_float32_data(5)
    assert binary_metrics(labels, np.full(labels.size, labels.mean()))["ne"] == pytest.approx(1.0, abs=1e-12)
    weights = np.random.default_rng(5).random(labels.size) * 3
    weighted_rate = np.sum(weights * labels) / np.sum(weights)
    assert binary_metrics(labels, np.full(labels.size, weighted_rate), weights)["ne"] == pytest.approx(1.0, abs=1e-12)


def test_ne_is_the_logloss_over_the_entropy_of_the_observed_ctr():
    labels, preds = tied_float32_data(6)
    metrics = binary_metrics(labels, preds)
    ctr = labels.mean()
    assert metrics["ne"] == pytest.approx(metrics["logloss"] / -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr)))
    assert metrics["ne"] < 1  # the predictions carry information beyond the base rate


@pytest.mark.parametrize("seed", [0, 1])
def test_a_row_of_weight_two_counts_as_the_row_twice(seed):
    labels, preds = tied_float32_data(seed, size=1500)
    weights = np.random.default_rng(seed).integers(0, 4, labels.size)  # 0 too: a row that does not count
    repeated = np.repeat(np.arange(labels.size), weights)
    weighted = ScoreCounts.of(labels, preds, weights.astype(np.float64))
    duplicated = ScoreCounts.of(labels[repeated], preds[repeated])
    of_weights, of_duplicates = binary_metrics_counts(weighted), binary_metrics_counts(duplicated)
    for key in ("auc", "logloss", "ne", "calibration", "mean_pred", "observed_ctr"):
        assert of_weights[key] == pytest.approx(of_duplicates[key], abs=1e-12), key
    assert of_weights["count"] == labels.size and of_weights["positives"] == labels.sum()  # rows, not weight
    assert of_weights["weight"] == weights.sum() == of_duplicates["count"]
    assert of_weights["positive_weight"] == np.sum(weights * labels)
    # The curve has a point per value, and a value only weightless rows predict is no value of the duplicates.
    counted = weights > 0
    curve_of_weights = roc_curve(labels[counted], preds[counted], 10_000, weights[counted])
    for by_weight, by_rows in zip(curve_of_weights, roc_curve_counts(duplicated, 10_000)):
        np.testing.assert_allclose(by_weight, by_rows, atol=1e-12)
    assert fit_platt_counts(weighted)["a"] == pytest.approx(fit_platt_counts(duplicated)["a"], abs=1e-9)
    assert of_weights["auc"] == pytest.approx(  # and to the pair-counting definition
        brute_force_auc(labels[repeated], preds[repeated].astype(np.float64)), abs=1e-12)


def test_weighted_counts_merge_save_and_calibrate_by_weight(tmp_path):
    labels, preds = tied_float32_data(7, size=1000)
    weights = np.random.default_rng(7).random(labels.size) * 2
    worker = np.arange(labels.size) % 3
    parts = [ScoreCounts.of(labels[worker == w], preds[worker == w], weights[worker == w]) for w in range(3)]
    whole = ScoreCounts.of(labels, preds, weights)
    merged = ScoreCounts.merge([*parts, ScoreCounts.of([], [])])  # an unweighted empty part: still weighted
    assert merged.weighted and merged.positives.dtype == np.int64
    np.testing.assert_array_equal(merged.values, whole.values)
    np.testing.assert_allclose(merged.positive_weights, whole.positive_weights, rtol=1e-12)
    assert binary_metrics_counts(merged) == pytest.approx(binary_metrics_counts(whole), abs=1e-12)
    whole.save(tmp_path / "weighted.npz")
    loaded = ScoreCounts.load(tmp_path / "weighted.npz")
    np.testing.assert_array_equal(loaded.negative_weights, whole.negative_weights)
    assert every_metric(loaded) == every_metric(whole)
    bins = calibration_bins_counts(whole, 4)
    assert [row["count"] for row in bins] == [250] * 4  # equal rows, weighted means
    assert sum(row["weight"] for row in bins) == pytest.approx(weights.sum())
    order = np.argsort(preds, kind="stable")[:250]  # the lowest bin (its last value may straddle: a tolerance)
    assert bins[0]["mean_pred"] == pytest.approx(np.average(preds[order], weights=weights[order]), abs=0.02)
    ece = sum(row["weight"] * abs(row["mean_pred"] - row["observed_rate"]) for row in bins) / weights.sum()
    assert expected_calibration_error_counts(whole, 4) == pytest.approx(ece)
    mapped = whole.mapped(lambda values: calibrate(values, {"method": "platt", "a": 1.2, "b": 0.1}))
    assert mapped.weighted and mapped.weight == pytest.approx(whole.weight)


def test_a_bin_of_weightless_rows_is_left_out_and_weights_are_checked():
    rows = calibration_bins([0, 1, 0, 1], [0.1, 0.2, 0.7, 0.8], bins=2, weights=[0, 0, 1, 1])
    assert [(row["bin"], row["count"], row["weight"], row["observed_rate"]) for row in rows] == [(1, 2, 2.0, 0.5)]
    with pytest.raises(ValueError, match=r"rows labelled 1 \(of 4 rows\) all weigh 0"):
        binary_metrics([0, 1, 0, 1], [0.1, 0.2, 0.7, 0.8], [1, 0, 1, 0])
    for weights, message in (([1, -1], r"finite and non-negative; 1 are not, e.g. weights\[1\] = -1.0"),
                             ([1, float("nan")], "finite and non-negative"), ([1], "differ in length")):
        with pytest.raises(ValueError, match=message):
            ScoreCounts.of([0, 1], [0.2, 0.4], weights)
    with pytest.raises(ValueError, match="both arrays or both None"):
        ScoreCounts(np.array([0.1]), np.array([1]), np.array([0]), np.array([1.0]))


def test_the_report_and_kfp_carry_ne_gauc_and_the_slices(tmp_path, evaluated):
    metrics, (fpr, tpr, thresholds), calibration = evaluated
    metrics = {**metrics, "gauc": 0.61, "gauc_groups": 12, "gauc_skipped_groups": 3, "gauc_skipped_rows": 4,
               "gauc_by": "C1"}
    slices = ("C2", [{"value": 17, "rows": 1200, "ctr": 0.3, "auc": 0.7, "mean_pred": 0.33, "calibration": 1.1},
                     {"value": "other", "rows": 800, "ctr": 0.0, "auc": None, "mean_pred": 0.2,
                      "calibration": None}])
    weighted_bins = [{**row, "weight": 10.5} for row in calibration]
    write_report(tmp_path / "report.md", metrics, title="t", calibration=weighted_bins, slices=slices)
    text = (tmp_path / "report.md").read_text()
    assert f"| NE (logloss / entropy of the observed CTR) | {metrics['ne']:.4f} |" in text
    assert "| GAUC (AUC per group, weighted by the group's impressions) | 0.6100 |" in text
    assert "| gauc_by | C1 |" in text and "| gauc_skipped_rows | 4 |" in text
    assert "## Slices by C2 (its 1 most frequent ids, then every other)" in text
    assert "| Value | Examples | CTR | ROC AUC | Mean prediction | Calibration |" in text
    assert "| 17 | 1,200 | 0.3000 | 0.7000 | 0.3300 | 1.1000 |" in text and "| other | 800 | 0.0000 | n/a |" in text
    assert "| Bin | Examples | Weight | Prediction range |" in text and "| 10.5 |" in text
    write_report_html(tmp_path / "report.html", metrics, title="t", slices=slices)
    assert "<td>other</td>" in (tmp_path / "report.html").read_text()
    metrics_artifact = Metrics(name="m", uri=str(tmp_path / "m"))
    log_kfp_metrics(metrics_artifact, ClassificationMetrics(name="c", uri=str(tmp_path / "c")),
                    {**metrics, "slices": slices[1], "calibration_bins": calibration}, fpr, tpr, thresholds)
    assert metrics_artifact.metadata["ne"] == metrics["ne"] and metrics_artifact.metadata["gauc"] == 0.61
    assert "slices" not in metrics_artifact.metadata and "gauc_by" not in metrics_artifact.metadata
    log_kfp_metrics(Metrics(name="m", uri=str(tmp_path / "m2")), ClassificationMetrics(name="c", uri=str(tmp_path / "c2")),
                    {**metrics, "gauc": None}, fpr, tpr, thresholds)  # no group of both classes: nothing logged
