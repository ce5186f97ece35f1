"""The evaluation of a checkpoint on the test split: metrics, ROC curve, calibration, the report.

The checkpoint is scored by :class:`components.evaluate.scoring.Scorer`, the program the serving model runs too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np

from components.checkpoint import format as ckpt_io
from components.config import EvalConfig
from components.data_prep.multislot import Schema
from components.evaluate import metrics as metric_fns
from components.evaluate import report
from components.evaluate.scoring import Scorer, read_test_split


CONFUSION_FILE = "confusion.json"


def confusion_threshold(cfg: EvalConfig, stats: dict) -> tuple[float, str]:
    """``(threshold, where it comes from)``: ``eval.threshold``, else the training split's CTR."""
    if cfg.threshold is not None:
        return cfg.threshold, "eval.threshold"
    return float(stats["ctr"]["train"]), "the training split's CTR"


def evaluate(checkpoint_dir: str | os.PathLike, data_dir: str | os.PathLike, out_dir: str | os.PathLike,
             cfg: EvalConfig, training: Optional[dict] = None,
             markdown_path: Optional[str | os.PathLike] = None) -> dict[str, Any]:
    """Metrics of the checkpoint on the test split; writes metrics.json, roc.png, roc.npz, confusion.json and
    report.md/html, and to ``markdown_path`` the report without the linked ROC image (a KFP Markdown artifact,
    whose viewer cannot follow a relative link; the ROC curve is the ClassificationMetrics artifact)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = ckpt_io.load(checkpoint_dir)
    stats = json.loads((Path(data_dir) / "stats.json").read_text())
    labels, dense, sparse = read_test_split(data_dir, Schema.from_dict(checkpoint.meta["schema"]))
    preds = Scorer(checkpoint).predict(dense, sparse)
    measured = metric_fns.binary_metrics(labels, preds)
    result = dict(measured)
    reference = stats.get("bayes")
    if reference:
        result["bayes_auc"] = reference["auc"]
        result["bayes_logloss"] = reference["logloss"]
        result["auc_ratio_to_bayes"] = result["auc"] / reference["auc"]
    fpr, tpr, thresholds = metric_fns.roc_curve(labels, preds, max_points=cfg.roc_points)
    calibration = metric_fns.calibration_bins(labels, preds, bins=cfg.calibration_bins)
    threshold, threshold_source = confusion_threshold(cfg, stats)
    confusion = report.confusion_summary(metric_fns.confusion_matrix(labels, preds, threshold), threshold,
                                         threshold_source)
    report.write_roc_png(out / "roc.png", fpr, tpr, result["auc"], reference_auc=(reference or {}).get("auc"))
    meta = checkpoint.meta
    summary = {"model": meta["model"]["name"], "mode": meta["mode"], "servers": meta["servers"],
               "workers": meta["workers"], "embedding_dim": meta["table"]["embedding_dim"],
               "sparse_rule": meta["table"]["rule"], "table_rows": meta["rows"]}
    kwargs = dict(title="CTR model evaluation", reference=reference, calibration=calibration,
                  training=training, config_summary=summary, confusion=confusion)
    # The report sets the measured metrics against the reference itself.
    report.write_report(out / "report.md", measured, roc_png_name="roc.png", **kwargs)
    if markdown_path is not None:
        report.write_report(markdown_path, measured, **kwargs)
    report.write_report_html(out / "report.html", measured, roc_png_path=out / "roc.png", **kwargs)
    ckpt_io.write_json_atomic(out / "metrics.json", result)
    np.savez(out / "roc.npz", fpr=fpr, tpr=tpr, thresholds=thresholds)
    ckpt_io.write_json_atomic(out / CONFUSION_FILE, confusion)
    return result
