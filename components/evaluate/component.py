"""KFP v2 component for evaluation: a thin wrapper over :func:`components.evaluate.evaluate.evaluate`.

Artifacts:

* ``metrics`` (``Metrics``): the scalar metrics in its metadata (what the KFP UI shows); its path is the
  evaluation directory: ``metrics.json``, ``roc.png``, ``roc.npz``, ``report.md``, ``report.html``.
* ``roc`` (``ClassificationMetrics``): the ROC curve, drawn by the KFP UI.
* ``report`` (``HTML``): the self-contained report page (ROC plot inlined).
"""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
from kfp import dsl
from kfp.dsl import HTML, ClassificationMetrics, Dataset, Input, Metrics, Model, Output

from components.data_prep.component import PIPELINE_IMAGE, step_config

# Training facts from the Model artifact's metadata that the report lists.
TRAINING_KEYS = ("epochs", "examples", "seconds", "examples_per_s", "final_train_auc")


def training_facts(checkpoint_metadata: Optional[dict]) -> Optional[dict]:
    facts = {k: checkpoint_metadata[k] for k in TRAINING_KEYS if (checkpoint_metadata or {}).get(k) is not None}
    return facts or None


def evaluate_checkpoint(config: Any, data_dir: str, checkpoint_path: str, checkpoint_metadata: Optional[dict],
                        out_dir: str, report_path: Optional[str] = None) -> tuple[dict, dict]:
    """Score the checkpoint the Model artifact points at on the test split of ``data_dir``.

    Writes the evaluation files into ``out_dir`` and, when given, the HTML report to ``report_path``;
    returns ``(metrics, roc)`` with ``roc`` holding ``fpr``, ``tpr`` and ``thresholds``.
    """
    from components.evaluate.evaluate import evaluate
    from components.train.component import checkpoint_dir, read_pointer

    cfg = step_config(config)
    uri = read_pointer(checkpoint_path, checkpoint_metadata)
    metrics = evaluate(checkpoint_dir(uri), data_dir, out_dir, cfg.eval, training=training_facts(checkpoint_metadata))
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(out_dir) / "report.html", report_path)
    with np.load(Path(out_dir) / "roc.npz") as roc:
        curve = {name: roc[name] for name in ("fpr", "tpr", "thresholds")}
    return metrics, curve


# A running step imports this module for the plain functions above, and there kfp.dsl is the runtime
# subset (_KFP_RUNTIME=true): it has no decorators, and the component object is not needed.
if hasattr(dsl, "component"):
    @dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False)
    def evaluate_model(config: dict, dataset: Input[Dataset], checkpoint: Input[Model], metrics: Output[Metrics],
                       roc: Output[ClassificationMetrics], report: Output[HTML]):
        """Test-split metrics of the trained checkpoint, its ROC curve and an HTML report."""
        from components.evaluate.component import evaluate_checkpoint
        from components.evaluate.report import log_kfp_metrics

        result, curve = evaluate_checkpoint(config, dataset.path, checkpoint.path, checkpoint.metadata,
                                            metrics.path, report.path)
        log_kfp_metrics(metrics, roc, result, curve["fpr"], curve["tpr"], curve["thresholds"])
