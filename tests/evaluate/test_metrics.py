"""Unit tests for components.evaluate.metrics and components.evaluate.report (no Paddle, no Hydra)."""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest
from kfp.dsl import ClassificationMetrics, Metrics

from components.evaluate.metrics import LOGLOSS_EPS, binary_metrics, calibration_bins, confusion_matrix, roc_curve
from components.evaluate.report import (confusion_summary, log_kfp_metrics, write_reliability_png, write_report,
                                        write_report_html,
                                        write_roc_png)
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
    assert "| examples_per_s | 123,456.8 |" in text
    assert "| wall_time_s[worker] | 61.5 |" in text
    assert "| sparse_dim | 1,000,003 |" in text
    assert "| lr | 0.001 |" in text
    assert "| note | a\\|b |" in text
    assert "![ROC curve](roc.png)" in text
    assert "## Baseline" in text and "| lift_auc | 0.02 |" in text and "## Empty" not in text


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
    from components.evaluate.metrics import expected_calibration_error, fit_platt

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
