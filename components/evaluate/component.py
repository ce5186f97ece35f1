"""KFP v2 components of the evaluation: the baseline's fit (:mod:`components.evaluate.baseline_step`) and the
evaluation itself (:mod:`components.evaluate.step`)."""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from kfp import dsl
from kfp.dsl import HTML, ClassificationMetrics, Dataset, Input, Markdown, Metrics, Model, Output

from components.config import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def fit_baseline(dataset: Input[Dataset], rows: int, features: int, baseline: Output[Model], handoff_root: str = ""):
    """The hashed logistic regression the evaluation scores beside the model: it needs the dataset, not the model.
    ``handoff_root``: where the fit is published for a job training beside it (taken from there when it is)."""
    from components.evaluate.baseline_step import fit_baseline as fit
    from components.networks.baseline_handoff import handoff_uri

    handoff = handoff_uri(handoff_root, dataset.uri, rows, features) if handoff_root else ""
    baseline.metadata.update(fit(dataset.path, rows, features, baseline.path, handoff))


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def evaluate_model(config: dict, dataset: Input[Dataset], checkpoint: Input[Model], metrics: Output[Metrics],
                   roc: Output[ClassificationMetrics], report: Output[HTML], report_markdown: Output[Markdown],
                   baseline: Input[Model] = None) -> float:
    """Test-split metrics of the trained checkpoint, its ROC curve and confusion matrix, the report as HTML and
    Markdown; returns the test AUC (the export's gate; a single unnamed output, the kind of output kfp.local can
    evaluate a condition on)."""
    from components.evaluate.report import log_kfp_metrics
    from components.evaluate.step import evaluate_checkpoint

    result, charts = evaluate_checkpoint(config, dataset.path, checkpoint.path, checkpoint.metadata,
                                         metrics.path, report.path, report_markdown.path,
                                         baseline.path if baseline is not None else None)
    log_kfp_metrics(metrics, roc, result, **charts)
    return result["auc"]
