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


def evaluate(checkpoint_dir: str | os.PathLike, data_dir: str | os.PathLike, out_dir: str | os.PathLike,
             cfg: EvalConfig, training: Optional[dict] = None) -> dict[str, Any]:
    """Metrics of the checkpoint on the test split; writes metrics.json, roc.png, report.md/html."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = ckpt_io.load(checkpoint_dir)
    stats = json.loads((Path(data_dir) / "stats.json").read_text())
    if None not in (stats.get("hash_function"), checkpoint.meta.get("hash_function")) and \
            stats["hash_function"] != checkpoint.meta["hash_function"]:
        raise ckpt_io.CheckpointError(f"checkpoint {checkpoint_dir} was trained on ids of {checkpoint.meta['hash_function']!r}, "
                                      f"the data in {data_dir} has ids of {stats['hash_function']!r}")
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
    report.write_roc_png(out / "roc.png", fpr, tpr, result["auc"], reference_auc=(reference or {}).get("auc"))
    meta = checkpoint.meta
    summary = {"model": meta["model"]["name"], "mode": meta["mode"], "servers": meta["servers"],
               "workers": meta["workers"], "embedding_dim": meta["table"]["embedding_dim"],
               "sparse_rule": meta["table"]["rule"], "table_rows": meta["rows"]}
    kwargs = dict(title="CTR model evaluation", reference=reference, calibration=calibration,
                  training=training, config_summary=summary)
    # The report sets the measured metrics against the reference itself.
    report.write_report(out / "report.md", measured, roc_png_name="roc.png", **kwargs)
    report.write_report_html(out / "report.html", measured, roc_png_path=out / "roc.png", **kwargs)
    ckpt_io.write_json_atomic(out / "metrics.json", result)
    np.savez(out / "roc.npz", fpr=fpr, tpr=tpr, thresholds=thresholds)
    return result
