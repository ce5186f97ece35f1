"""Human-readable evaluation report (Markdown, self-contained HTML, PNG figures) and KFP metrics.

The report content is assembled once as titled tables and then rendered to
either Markdown (for the run's output bucket) or HTML with the figures
embedded as base64 (for a KFP ``HTML`` artifact, which the UI shows inline but
cannot resolve relative image links for).
"""

from __future__ import annotations

import base64
import html
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from components.evaluate.groups import OTHER_SLICE
from components.metrics import CONFUSION_CLASSES

# Display labels for the keys binary_metrics returns, in table order; any other
# scalar key in the metrics dict is still shown, under its own name.
_METRIC_LABELS = {
    "auc": "ROC AUC",
    "gauc": "GAUC (AUC per group, weighted by the group's impressions)",
    "logloss": "Logloss",
    "ne": "NE (logloss / entropy of the observed CTR)",
    "calibration": "Calibration (mean prediction / observed CTR)",
    "mean_pred": "Mean prediction",
    "observed_ctr": "Observed CTR",
    "count": "Examples",
    "positives": "Positives",
    "weight": "Weight (of the examples)",
    "positive_weight": "Weight of the positives",
}
# The keys of the report's other tables (the baseline, the calibration, the run's summary) as a reader says them;
# a key not here is already a reader's (a day, "server 0") and is shown as it is.
_KEY_LABELS = {
    "ece": "ECE (expected calibration error: mean |prediction - observed rate| over the bins)",
    "uncalibrated_ece": "ECE before calibration",
    "uncalibrated_calibration": "Calibration before calibration (mean prediction / observed CTR)",
    "uncalibrated_logloss": "Logloss before calibration",
    "method": "Method",
    "a": "Slope a (p = sigmoid(a * logit + b))",
    "b": "Intercept b",
    "baseline_auc": "Baseline ROC AUC",
    "baseline_logloss": "Baseline logloss",
    "lift_auc": "Lift (model AUC - baseline AUC)",
    "baseline_rows": "Baseline training rows",
    "baseline_features": "Baseline hashed features",
    "baseline_l2": "Baseline L2 penalty",
    "baseline_l2_chosen_by": "Baseline L2 chosen by",
    "embedding_dim": "Embedding dimension",
    "sparse_rule": "Sparse optimizer rule",
    "table_rows": "Table rows",
    "model": "Model",
    "mode": "PS mode",
    "servers": "Servers",
    "workers": "Workers",
    "epochs": "Passes over the data",
    "examples": "Examples trained",
    "seconds": "Training time (s)",
    "examples_per_s": "Examples per second",
    "final_train_auc": "Train AUC at the end (running)",
    "examples_trained_twice": "Examples trained again after a restart",
}


def _label(key: str) -> str:
    """A table key as a reader says it."""
    return _METRIC_LABELS.get(key) or _KEY_LABELS.get(key) or key


def _figure(size: tuple[float, float]) -> Figure:
    """A figure drawn by Agg, not by pyplot: no global state, no display needed."""
    figure = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _save_png(figure: Figure, path: str | os.PathLike[str]) -> None:
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")


def write_roc_png(
    path: str | os.PathLike[str],
    fpr: Sequence[float],
    tpr: Sequence[float],
    auc: float,
    reference_auc: float | None = None,
) -> None:
    """Plot the ROC curve with the chance diagonal; the legend carries the AUC."""
    # A bare Figure on the Agg canvas leaves pyplot's global backend alone.
    figure = _figure((5.5, 5.5))
    axes = figure.add_subplot()
    axes.plot(fpr, tpr, color="tab:blue", linewidth=2, label=f"model (AUC = {auc:.4f})")
    axes.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="chance (AUC = 0.5)")
    title = "ROC curve"
    if reference_auc is not None:
        title += f"\nBayes-optimal AUC = {reference_auc:.4f} (model reaches {auc / reference_auc:.1%})"
    axes.set_title(title)
    axes.set_xlabel("False positive rate")
    axes.set_ylabel("True positive rate")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1.01)
    axes.set_aspect("equal")
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    _save_png(figure, path)


def write_reliability_png(
    path: str | os.PathLike[str],
    bins: Sequence[Mapping[str, Any]],
    calibrated_bins: Sequence[Mapping[str, Any]] | None = None,
) -> None:
    """Reliability diagram: observed click rate against mean prediction per bin, before and after calibration."""
    figure = _figure((5.5, 5.5))
    axes = figure.add_subplot()
    highest = max(max(r["mean_pred"], r["observed_rate"]) for r in [*bins, *(calibrated_bins or [])])
    axes.plot([0, highest], [0, highest], color="grey", linestyle="--", linewidth=1, label="perfectly calibrated")
    series = [("model", bins, "tab:orange")]
    if calibrated_bins:
        series = [("model, uncalibrated", bins, "tab:orange"), ("model, calibrated", calibrated_bins, "tab:blue")]
    for label, rows, color in series:
        axes.plot([r["mean_pred"] for r in rows], [r["observed_rate"] for r in rows], marker="o", color=color,
                  label=label)
    axes.set_title("Reliability (equal-count bins of prediction)")
    axes.set_xlabel("Mean prediction")
    axes.set_ylabel("Observed click rate")
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left")
    _save_png(figure, path)


def write_training_curve_png(path: str | os.PathLike[str], curve: Mapping[str, Sequence[Sequence[float]]]) -> None:
    """Running loss and AUC against the examples each worker trained (over all passes), a line per worker.

    ``curve``: worker name -> ``[examples, loss, auc]`` points (:attr:`components.train.job.EventLog.curve`).
    """
    figure = _figure((10, 4.2))
    loss_axes, auc_axes = figure.subplots(1, 2)
    for worker, points in sorted(curve.items(), key=lambda item: item[0]):
        examples, loss, auc = (np.asarray(column, dtype=float) for column in zip(*points))
        loss_axes.plot(examples, loss, marker=".", label=worker)
        auc_axes.plot(examples, auc, marker=".", label=worker)
    for axes, name in ((loss_axes, "Running loss"), (auc_axes, "Running AUC (this pass)")):
        axes.set_title(name)
        axes.set_xlabel("Examples trained by the worker")
        axes.grid(alpha=0.3)
        axes.legend(loc="best")
    _save_png(figure, path)


def write_report(
    path: str | os.PathLike[str],
    metrics: Mapping[str, Any],
    *,
    title: str,
    reference: Mapping[str, Any] | None = None,
    calibration: Sequence[Mapping[str, Any]] | None = None,
    training: Mapping[str, Any] | None = None,
    config_summary: Mapping[str, Any] | None = None,
    figures: Sequence[tuple[str, str | os.PathLike[str]]] = (),
    tables: Sequence[tuple[str, Mapping[str, Any]]] = (),
    confusion: Mapping[str, Any] | None = None,
    slices: tuple[str, Sequence[Mapping[str, Any]]] | None = None,
) -> None:
    """Write the report as Markdown; ``figures`` (title, PNG path) are linked by name, relative to the report.

    ``metrics`` is what ``binary_metrics`` returns; ``reference`` the data
    generator's Bayes-optimal ``{"auc", "logloss"}``; ``calibration`` the rows of
    ``calibration_bins``; ``training`` and ``config_summary`` any flat key/values; ``tables`` more (heading,
    key/values); ``confusion`` a :func:`confusion_summary`; ``slices`` ``(slot, the rows of
    components.evaluate.groups.slice_metrics)``. Sections whose input is None or empty are left out.
    """
    summary, metrics_table, other_tables = _report_content(
        metrics, reference, calibration, training, config_summary, tables, confusion, slices
    )
    lines = [f"# {title}", ""]
    if summary:
        lines += [summary, ""]
    lines += [f"## {metrics_table.heading}", "", *_markdown_table(metrics_table), ""]
    for caption, png in figures:
        lines += [f"## {caption}", "", f"![{caption}]({Path(png).name})", ""]
    for table in other_tables:
        lines += [f"## {table.heading}", "", *_markdown_table(table), ""]
    _write_text(path, "\n".join(lines))


def write_report_html(
    path: str | os.PathLike[str],
    metrics: Mapping[str, Any],
    *,
    title: str,
    reference: Mapping[str, Any] | None = None,
    calibration: Sequence[Mapping[str, Any]] | None = None,
    training: Mapping[str, Any] | None = None,
    config_summary: Mapping[str, Any] | None = None,
    figures: Sequence[tuple[str, str | os.PathLike[str]]] = (),
    tables: Sequence[tuple[str, Mapping[str, Any]]] = (),
    confusion: Mapping[str, Any] | None = None,
    slices: tuple[str, Sequence[Mapping[str, Any]]] | None = None,
) -> None:
    """Write the same report as one self-contained HTML page, the figures inlined as base64."""
    summary, metrics_table, other_tables = _report_content(
        metrics, reference, calibration, training, config_summary, tables, confusion, slices
    )
    body = [f"<h1>{html.escape(title)}</h1>"]
    if summary:
        body.append(f"<p>{html.escape(summary)}</p>")
    body += [f"<h2>{html.escape(metrics_table.heading)}</h2>", _html_table(metrics_table)]
    for caption, png in figures:
        encoded = base64.b64encode(Path(png).read_bytes()).decode("ascii")
        body += [f"<h2>{html.escape(caption)}</h2>",
                 f'<img alt="{html.escape(caption)}" src="data:image/png;base64,{encoded}">']
    for table in other_tables:
        body += [f"<h2>{html.escape(table.heading)}</h2>", _html_table(table)]
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; max-width: 60em; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.8em; }}
th {{ background: #f3f3f3; text-align: left; }}
</style>
</head>
<body>
{chr(10).join(body)}
</body>
</html>
"""
    _write_text(path, page)


def confusion_summary(
    matrix: Sequence[Sequence[int]], threshold: float, threshold_source: str
) -> dict[str, Any]:
    """The confusion matrix of ``confusion_matrix`` at ``threshold`` (``threshold_source`` says where that
    comes from) with the precision and recall it implies: what the report and the KFP artifact show."""
    (tn, fp), (fn, tp) = matrix
    return {"threshold": float(threshold), "threshold_source": threshold_source,
            "classes": list(CONFUSION_CLASSES), "matrix": [[int(tn), int(fp)], [int(fn), int(tp)]],
            "precision": tp / (tp + fp) if tp + fp else None, "recall": tp / (tp + fn) if tp + fn else None}


def log_kfp_metrics(
    metrics_artifact: Any,
    classification_artifact: Any,
    metrics: Mapping[str, Any],
    fpr: Iterable[float],
    tpr: Iterable[float],
    thresholds: Iterable[float],
    confusion: Mapping[str, Any] | None = None,
) -> None:
    """Log the numeric metrics to a ``kfp.dsl.Metrics``; the ROC curve and, when given, the confusion matrix
    (a :func:`confusion_summary`) to a ``ClassificationMetrics``, which the KFP UI draws side by side.

    KFP stores artifact metadata as JSON, which has no NaN or infinity: a
    non-finite metric is an error, while the ``+inf`` threshold that opens a
    ROC curve becomes 1.0 (no probability exceeds it, so the meaning is kept).
    """
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        if not math.isfinite(value):
            raise ValueError(f"metric {key!r} is {value}; KFP metadata only holds finite numbers")
        metrics_artifact.log_metric(key, float(value))

    threshold_array = np.asarray(list(thresholds), dtype=np.float64)
    if np.isnan(threshold_array).any():
        raise ValueError("ROC thresholds contain NaN")
    finite_thresholds = np.nan_to_num(threshold_array, posinf=1.0, neginf=0.0)
    classification_artifact.log_roc_curve(
        [float(value) for value in fpr],
        [float(value) for value in tpr],
        [float(value) for value in finite_thresholds],
    )
    if confusion is not None:
        classification_artifact.log_confusion_matrix(list(confusion["classes"]), confusion["matrix"])
        # The KFP UI does not show a threshold with the matrix: the artifact's metadata states it.
        classification_artifact.metadata["confusionMatrixThreshold"] = confusion["threshold"]
        classification_artifact.metadata["confusionMatrixThresholdSource"] = confusion["threshold_source"]


@dataclass(frozen=True)
class _Table:
    heading: str
    header: tuple[str, ...]
    rows: list[tuple[str, ...]]


def _report_content(
    metrics: Mapping[str, Any],
    reference: Mapping[str, Any] | None,
    calibration: Sequence[Mapping[str, Any]] | None,
    training: Mapping[str, Any] | None,
    config_summary: Mapping[str, Any] | None,
    tables: Sequence[tuple[str, Mapping[str, Any]]] = (),
    confusion: Mapping[str, Any] | None = None,
    slices: tuple[str, Sequence[Mapping[str, Any]]] | None = None,
) -> tuple[str, _Table, list[_Table]]:
    """The one-line summary, the metrics table and the other tables, shared by both renderings."""
    metric_rows = [
        (label, _format_score(metrics[key])) for key, label in _METRIC_LABELS.items() if key in metrics
    ]
    metric_rows += [
        (_label(key), _format_value(value)) for key, value in metrics.items() if key not in _METRIC_LABELS
    ]
    metric_rows += _reference_rows(metrics, reference or {})
    metrics_table = _Table("Metrics", ("Metric", "Value"), metric_rows)

    other_tables = []
    if confusion:
        other_tables.append(_confusion_table(confusion))
    if calibration:
        weighted = "weight" in calibration[0]
        other_tables.append(
            _Table(
                "Calibration by prediction quantile",
                ("Bin", "Examples", *(("Weight",) if weighted else ()), "Prediction range", "Mean prediction",
                 "Observed rate", "Ratio"),
                [_calibration_row(row) for row in calibration],
            )
        )
    if slices and slices[1]:
        other_tables.append(_slices_table(*slices))
    other_tables += [_key_value_table(heading, values) for heading, values in tables if values]
    if training:
        other_tables.append(_key_value_table("Training", training))
    if config_summary:
        other_tables.append(_key_value_table("Configuration", config_summary))
    return _summary_sentence(metrics, reference or {}), metrics_table, other_tables


def _confusion_table(confusion: Mapping[str, Any]) -> _Table:
    classes = confusion["classes"]
    rows = [(f"Actual {name}", *(f"{count:,}" for count in counts))
            for name, counts in zip(classes, confusion["matrix"])]
    rows += [(name.capitalize(), _format_score(confusion[name]) if confusion[name] is not None else "n/a", "")
             for name in ("precision", "recall")]
    heading = (f"Confusion matrix at threshold {_format_score(confusion['threshold'])} "
               f"({confusion['threshold_source']})")
    return _Table(heading, ("", *(f"Predicted {name}" for name in classes)), rows)


def _reference_rows(metrics: Mapping[str, Any], reference: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Bayes-optimal ceilings from the data generator and how close the model gets."""
    rows = []
    reference_auc = reference.get("auc")
    if reference_auc is not None:
        rows.append(("Reference (Bayes-optimal) AUC", _format_score(reference_auc)))
        if "auc" in metrics:
            rows.append(("AUC / reference AUC", f"{metrics['auc'] / reference_auc:.2%}"))
            # The plain ratio is flattered by the 0.5 every random model gets.
            if reference_auc > 0.5:
                lift_share = (metrics["auc"] - 0.5) / (reference_auc - 0.5)
                rows.append(("(AUC - 0.5) / (reference AUC - 0.5)", f"{lift_share:.2%}"))
    reference_logloss = reference.get("logloss")
    if reference_logloss is not None:
        rows.append(("Reference (Bayes-optimal) logloss", _format_score(reference_logloss)))
        if "logloss" in metrics:
            excess_logloss = metrics["logloss"] - reference_logloss
            rows.append(("Logloss - reference logloss", _format_score(excess_logloss)))
    rows += [
        (f"Reference {key}", _format_value(value))
        for key, value in reference.items()
        if key not in ("auc", "logloss")
    ]
    return rows


def _summary_sentence(metrics: Mapping[str, Any], reference: Mapping[str, Any]) -> str:
    if "auc" not in metrics:
        return ""
    sentence = f"ROC AUC {_format_score(metrics['auc'])}"
    if "count" in metrics:
        sentence += f" on {_format_score(metrics['count'])} examples"
    if reference.get("auc") is not None:
        sentence += (
            f" ({metrics['auc'] / reference['auc']:.1%} of the Bayes-optimal "
            f"{_format_score(reference['auc'])})"
        )
    if "calibration" in metrics:
        sentence += f"; calibration {_format_score(metrics['calibration'])}"
    return sentence + "."


def _calibration_row(row: Mapping[str, Any]) -> tuple[str, ...]:
    observed = row["observed_rate"]
    ratio = _format_score(row["mean_pred"] / observed) if observed > 0 else "n/a"
    return (
        str(row["bin"]),
        _format_score(row["count"]),
        *((_format_value(row["weight"]),) if "weight" in row else ()),
        f"{_format_score(row['pred_min'])} - {_format_score(row['pred_max'])}",
        _format_score(row["mean_pred"]),
        _format_score(observed),
        ratio,
    )


def _slices_table(slot: str, rows: Sequence[Mapping[str, Any]]) -> _Table:
    """A row per slice: its rows (and weight), CTR, AUC, mean prediction and calibration ("n/a" where undefined)."""
    columns = [("rows", "Examples"), ("weight", "Weight"), ("ctr", "CTR"), ("auc", "ROC AUC"),
               ("mean_pred", "Mean prediction"), ("calibration", "Calibration"),
               ("uncalibrated_calibration", "Calibration before the post-hoc calibration")]
    present = [(key, label) for key, label in columns if key in rows[0]]
    top = sum(1 for row in rows if row["value"] != OTHER_SLICE)
    return _Table(f"Slices by {slot} (its {top} most frequent ids, then every other)",
                  ("Value", *(label for _, label in present)),
                  [(str(row["value"]), *(_format_score(row[key]) for key, _ in present)) for row in rows])


def _key_value_table(heading: str, values: Mapping[str, Any]) -> _Table:
    rows = [(_label(str(key)), _format_value(value)) for key, value in values.items()]
    return _Table(heading, ("Key", "Value"), rows)


def _format_score(value: Any) -> str:
    """AUC, logloss, rates and ratios to a fixed 4 decimals so they line up and compare at a glance (None: a metric
    that is undefined there, such as the AUC of one class)."""
    if value is None:
        return "n/a"
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return _format_value(value)
    return f"{float(value):.4f}"


def _format_value(value: Any) -> str:
    """Any key/value entry: counts with thousands separators, floats to 6 significant digits."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isfinite(value) and abs(value) >= 1000:
            return f"{value:,.1f}"
        return f"{value:.6g}"
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, default=str)
    return str(value)


def _markdown_table(table: _Table) -> list[str]:
    def cells(values: Iterable[str]) -> str:
        # A pipe or newline inside a cell would break the table's row structure.
        return "| " + " | ".join(v.replace("|", "\\|").replace("\n", " ") for v in values) + " |"

    return [cells(table.header), "|" + "---|" * len(table.header), *(cells(row) for row in table.rows)]


def _html_table(table: _Table) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in table.header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in table.rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _write_text(path: str | os.PathLike[str], text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")
