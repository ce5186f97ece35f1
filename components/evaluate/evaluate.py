"""The evaluation of a checkpoint on the test split: metrics, ROC curve, calibration, the baseline, the report.

The checkpoint was scored on the test split while the job trained, through the servers, by every worker
(:mod:`components.ps.pull_scoring`): this step reads the merged counts of its predictions (``scores/test.npz``, a
few bytes per distinct prediction: no process here holds the table) and applies the calibration the checkpoint
carries (fitted on the validation split while it was trained: :mod:`components.ps.validation`), as the served
model does: the metrics are those of the delivered model, with the uncalibrated ones beside them. A hashed logistic regression trained on the same shards
(:mod:`components.evaluate.baseline`) is scored too: the model's lift over it. With ``eval.group_by`` or
``eval.slices``, the workers also saved every test row's prediction (``scores/test-rows/``): aligned with the test
split read here, they give the GAUC and the slices (:mod:`components.evaluate.groups`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np

from components.checkpoint import format as ckpt_io
from components.config import EvalConfig
from components.config_rules import check_eval_slots
from components.data_prep.multislot import Schema
from components import metrics as metric_fns
from components.evaluate import groups, report
from components.evaluate.baseline_step import load_baseline
from components.evaluate.days import DAYS_CSV, DAYS_PNG, day_rows, write_days_csv, write_days_png
from components.networks.scoring import read_test_split


CONFUSION_FILE = "confusion.json"
CURVE_FILE = "training_curve.png"  # written only when the job reported progress


def confusion_threshold(cfg: EvalConfig, stats: dict) -> tuple[float, str]:
    """``(threshold, where it comes from)``: ``eval.threshold``, else the training split's CTR."""
    if cfg.threshold is not None:
        return cfg.threshold, "eval.threshold"
    return float(stats["ctr"]["train"]), "the training split's CTR"


def evaluate(checkpoint_dir: str | os.PathLike, data_dir: str | os.PathLike, out_dir: str | os.PathLike,
             cfg: EvalConfig, training: Optional[dict] = None,
             markdown_path: Optional[str | os.PathLike] = None, curve: Optional[dict] = None,
             servers: Optional[dict] = None, days: Optional[list[dict]] = None,
             baseline_dir: Optional[str | os.PathLike] = None, warnings: tuple[str, ...] = ()) -> dict[str, Any]:
    """Metrics of the checkpoint on the test split; writes metrics.json, roc.png, calibration.png, roc.npz,
    confusion.json and report.md/html, and to ``markdown_path`` the report without the linked images (a KFP Markdown
    artifact, whose viewer cannot follow a relative link; the ROC curve is the ClassificationMetrics artifact).

    ``curve``: the workers' training curves (:attr:`components.train.job.EventLog.curve`), drawn into
    training_curve.png; ``servers``: what the job measured of each server, a table of the report; ``days``: the trained
    days' rows (day-by-day training), written into days.csv and days.png; the day's drift warnings are reported;
    ``baseline_dir``: the fitted baseline (:func:`components.evaluate.baseline_step.fit_baseline`), scored beside the
    model (its lift over it); ``warnings``: lines about how the job ran, a table of the report."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = ckpt_io.verify_meta(checkpoint_dir, parts=ckpt_io.EVALUATION_PARTS)
    stats = json.loads((Path(data_dir) / "stats.json").read_text())
    if None not in (stats.get("hash_function"), meta.get("hash_function")) and \
            stats["hash_function"] != meta["hash_function"]:
        raise ckpt_io.CheckpointError(f"checkpoint {checkpoint_dir} was trained on ids of "
                                      f"{meta['hash_function']!r}, the data in {data_dir} has ids of "
                                      f"{stats['hash_function']!r}")
    schema = Schema.from_dict(meta["schema"])
    check_eval_slots(cfg, schema.sparse_slots)  # feasign input names its slots only in data prep
    grouped = cfg.group_by is not None or cfg.slices is not None
    test_split = read_test_split(data_dir, schema) if baseline_dir is not None or grouped else None
    raw_counts = ckpt_io.load_scores(checkpoint_dir, ckpt_io.TEST)
    calibration = meta.get("calibration")
    # Scored by the program that applies the calibration as the served model does: the same float32 arithmetic.
    counts = ckpt_io.load_scores(checkpoint_dir, ckpt_io.TEST_CALIBRATED) if calibration else raw_counts
    measured = {**metric_fns.binary_metrics_counts(counts),
                "ece": metric_fns.expected_calibration_error_counts(counts, cfg.calibration_bins)}
    slices = None
    if grouped:
        by_group, slices = _grouped_metrics(checkpoint_dir, data_dir, stats, schema, cfg, test_split,
                                            calibrated=bool(calibration))
        measured.update(by_group)
    result = dict(measured)
    uncalibrated = metric_fns.binary_metrics_counts(raw_counts)
    if calibration:
        result.update(uncalibrated_logloss=uncalibrated["logloss"], uncalibrated_calibration=uncalibrated["calibration"],
                      uncalibrated_ece=metric_fns.expected_calibration_error_counts(raw_counts, cfg.calibration_bins))
    if baseline_dir is not None:
        labels, dense, sparse = test_split
        model, baseline_fit = load_baseline(baseline_dir)
        baseline = metric_fns.binary_metrics(labels, model.predict(dense, sparse))
        result.update(baseline_auc=baseline["auc"], baseline_logloss=baseline["logloss"],
                      lift_auc=result["auc"] - baseline["auc"], **baseline_fit)
    validation = meta.get("validation") or {}
    result.update({f"validation_{key}": validation[key] for key in ("auc", "logloss") if key in validation})
    reference = stats.get("bayes")
    if reference:
        result["bayes_auc"] = reference["auc"]
        result["bayes_logloss"] = reference["logloss"]
        result["auc_ratio_to_bayes"] = result["auc"] / reference["auc"]
    fpr, tpr, thresholds = metric_fns.roc_curve_counts(counts, max_points=cfg.roc_points)
    bins = metric_fns.calibration_bins_counts(counts, bins=cfg.calibration_bins)
    result["calibration_bins"] = bins
    if slices is not None:
        result.update(slices=slices, slices_by=cfg.slices)
    threshold, threshold_source = confusion_threshold(cfg, stats)
    confusion = report.confusion_summary(metric_fns.confusion_matrix_counts(counts, threshold), threshold,
                                         threshold_source)
    report.write_roc_png(out / "roc.png", fpr, tpr, result["auc"], reference_auc=(reference or {}).get("auc"))
    report.write_reliability_png(out / "calibration.png",
                                 metric_fns.calibration_bins_counts(raw_counts, bins=cfg.calibration_bins)
                                 if calibration else bins, bins if calibration else None)
    summary = {"model": meta["model"]["name"], "mode": meta["mode"], "servers": meta["servers"],
               "workers": meta["workers"], "embedding_dim": meta["table"]["embedding_dim"],
               "sparse_rule": meta["table"]["rule"], "table_rows": meta["rows"]}
    comparisons = [("Baseline: hashed logistic regression on the same shards",
                    {k: result[k] for k in ("baseline_auc", "baseline_logloss", "lift_auc", "baseline_rows",
                                            "baseline_features", "baseline_l2", "baseline_l2_chosen_by")
                     if k in result}),
                   ("Calibration (fitted on the validation split)",
                    {**{k: result[k] for k in ("ece", "uncalibrated_ece", "uncalibrated_calibration",
                                               "uncalibrated_logloss") if k in result},
                     **(calibration or {})}),
                   ("Validation split (the delivered checkpoint)", validation),
                   ("Servers (rows at the last checkpoint, memory)", servers or {})]
    if warnings:  # about how the job ran (the PS plane in plaintext across hosts): the report says them too
        comparisons.append(("How the job ran (warnings)", {str(i): w for i, w in enumerate(warnings, 1)}))
    drift = stats.get("drift") or {}
    if drift.get("warnings"):
        comparisons.append((f"Drift from day {drift.get('previous_day')!r} (warnings)",
                            {str(i): warning for i, warning in enumerate(drift["warnings"], 1)}))
    kwargs = dict(title="CTR model evaluation", reference=reference, calibration=bins, training=training,
                  config_summary=summary, tables=comparisons, confusion=confusion,
                  slices=(cfg.slices, slices) if slices is not None else None)
    figures = [("ROC curve", out / "roc.png"), ("Reliability", out / "calibration.png")]
    if days:
        write_days_csv(out / DAYS_CSV, days)
        write_days_png(out / DAYS_PNG, days)
        figures.append(("Day by day (days.csv): each day's model before training on it", out / DAYS_PNG))
        comparisons.append(("Days trained (days.csv)", day_rows(days)))
    if curve:
        report.write_training_curve_png(out / CURVE_FILE, curve)
        figures.append(("Training curve (running loss and AUC of each worker)", out / CURVE_FILE))
    # The report sets the measured metrics against the reference itself.
    report.write_report(out / "report.md", measured, figures=figures, **kwargs)
    if markdown_path is not None:
        report.write_report(markdown_path, measured, **kwargs)
    report.write_report_html(out / "report.html", measured, figures=figures, **kwargs)
    ckpt_io.write_json_atomic(out / "metrics.json", result)
    np.savez(out / "roc.npz", fpr=fpr, tpr=tpr, thresholds=thresholds)
    ckpt_io.write_json_atomic(out / CONFUSION_FILE, confusion)
    return result


def _grouped_metrics(checkpoint_dir: str | os.PathLike, data_dir: str | os.PathLike, stats: dict, schema: Schema,
                     cfg: EvalConfig, test_split: tuple, calibrated: bool) -> tuple[dict, Optional[list[dict]]]:
    """``(GAUC over eval.group_by, the slices of eval.slices)``, each when asked for, of the delivered predictions
    (through the calibration when the checkpoint carries one): the workers' per-row predictions, weighted as their
    counts were, aligned with the rows of the test split."""
    labels, _, sparse = test_split
    rows = ckpt_io.load_row_predictions(checkpoint_dir, stats["shards"]["test"], stats["shard_rows"]["test"])
    if len(rows.raw) != len(labels):
        raise ckpt_io.CheckpointError(f"the test shards of {data_dir} hold {len(labels)} rows, {len(rows.raw)} by "
                                      "their row counts in its stats.json: the dataset is damaged")
    if calibrated and rows.calibrated is None:
        raise ckpt_io.CheckpointError(f"checkpoint {checkpoint_dir} carries a calibration but its per-row test "
                                      "predictions were not scored through it")
    preds = rows.calibrated if calibrated else rows.raw

    def group_of_row(slot: str) -> np.ndarray:
        return groups.first_ids(sparse[schema.sparse_slots.index(slot)], slot)

    by_group = {}
    if cfg.group_by is not None:
        by_group = {**groups.grouped_auc(group_of_row(cfg.group_by), labels, preds, rows.weights),
                    "gauc_by": cfg.group_by}
    slices = None
    if cfg.slices is not None:
        slices = groups.slice_metrics(group_of_row(cfg.slices), labels, preds, cfg.slice_top, rows.weights,
                                      uncalibrated=rows.raw if calibrated else None)
    return by_group, slices
