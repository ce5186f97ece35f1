"""KFP v2 component for evaluation; the code it runs is :mod:`components.evaluate.step`."""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from kfp import dsl
from kfp.dsl import HTML, ClassificationMetrics, Dataset, Input, Markdown, Metrics, Model, Output

from components.config import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def evaluate_model(config: dict, dataset: Input[Dataset], checkpoint: Input[Model], metrics: Output[Metrics],
                   roc: Output[ClassificationMetrics], report: Output[HTML], report_markdown: Output[Markdown]
                   ) -> float:
    """Test-split metrics of the trained checkpoint, its ROC curve and confusion matrix, the report as HTML and
    Markdown; returns the test AUC (the export's gate; a single unnamed output, the kind of output kfp.local can
    evaluate a condition on)."""
    from components.evaluate.report import log_kfp_metrics
    from components.evaluate.step import evaluate_checkpoint

    result, charts = evaluate_checkpoint(config, dataset.path, checkpoint.path, checkpoint.metadata,
                                         metrics.path, report.path, report_markdown.path)
    log_kfp_metrics(metrics, roc, result, **charts)
    return result["auc"]
