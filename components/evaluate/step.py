"""What the evaluation step runs: plain functions over :func:`components.evaluate.evaluate.evaluate`.

Artifacts of the component:

* ``metrics`` (``Metrics``): the scalar metrics in its metadata (what the KFP UI shows: AUC, NE, GAUC, ...); its
  path is the evaluation directory: ``metrics.json`` (also the calibration bins and, with ``eval.slices``, the
  slices), ``roc.png``, ``roc.npz``, ``confusion.json``, ``report.md``, ``report.html``.
* ``roc`` (``ClassificationMetrics``): the ROC curve and the confusion matrix at ``eval.threshold`` (by default
  the training CTR), drawn side by side by the KFP UI.
* ``report`` (``HTML``): the self-contained report page (ROC plot inlined).
* ``report_markdown`` (``Markdown``): the same report as Markdown, rendered by the KFP UI.

The component returns the test AUC, which gates the export (``eval.min_auc``).
"""

import json
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np

from components.checkpoint.days import DayLedger
from components.checkpoint.evaluation import record_evaluation
from components.checkpoint.format import EVALUATION_PARTS
from components.checkpoint.pointer import fetched_checkpoint
from components.checkpoint.store import CheckpointStore
from components.config import from_dict, ints_from_struct
from components.days import day_of
from components.evaluate.baseline_step import fit_baseline
from components.evaluate.evaluate import CONFUSION_FILE, evaluate
from components.evaluate.server_load import load_facts
from components.ps.tls import plaintext_warning

# Training facts from the Model artifact's metadata that the report lists.
TRAINING_KEYS = ("epochs", "examples", "seconds", "examples_per_s", "final_train_auc", "examples_trained_twice")


def training_facts(checkpoint_metadata: Optional[dict]) -> Optional[dict]:
    """The training summary the train step left on the Model artifact, for the report."""
    meta = ints_from_struct(dict(checkpoint_metadata or {}))
    facts = {k: meta[k] for k in TRAINING_KEYS if meta.get(k) is not None}
    return facts or None


def server_facts(checkpoint_metadata: Optional[dict]) -> dict:
    """Per server, the rows it held at the last checkpoint and its peak RSS (local servers), and the plan's estimate
    for the fullest one, as the train step measured them; empty when it measured none."""
    meta = ints_from_struct(dict(checkpoint_metadata or {}))
    rows, peaks = meta.get("server_rows") or [], meta.get("server_peak_rss_gib") or []
    facts = {}
    for index in range(max(len(rows), len(peaks))):
        measured = ([f"{rows[index]:,} rows"] if index < len(rows) else []) + (
            [f"peak RSS {peaks[index] * 1024:,.1f} MiB"] if index < len(peaks) else [])
        facts[f"server {index}"] = ", ".join(measured)
    plan = meta.get("memory_plan")
    if facts and plan:
        facts["memory plan (fullest server)"] = (f"{plan['server_gib'] * 1024:,.1f} MiB for up to {plan['rows']:,} rows "
                                                 f"in {plan['shard_num']} shards, {plan['bytes_per_row']} B/row")
    return facts


def planned_shard_num(checkpoint_metadata: Optional[dict]) -> Optional[int]:
    """The shard count the train step resolved (its memory plan's), if it recorded one."""
    plan = dict(checkpoint_metadata or {}).get("memory_plan") or {}
    return int(plan["shard_num"]) if plan.get("shard_num") else None


def evaluate_checkpoint(config: Any, data_dir: str, checkpoint_path: str, checkpoint_metadata: Optional[dict],
                        out_dir: str, report_path: Optional[str] = None,
                        markdown_path: Optional[str] = None, baseline_dir: Optional[str] = None,
                        compose: bool = False) -> tuple[dict, dict]:
    """Score the checkpoint the Model artifact points at on the test split of ``data_dir``, and with ``eval.baseline``
    the baseline in ``baseline_dir`` (the fit-baseline step's; without one, fitted here into ``out_dir/baseline``).

    ``compose``: the job ran from a compose file (its roles on hosts of their own: the report warns when they talked
    in plaintext). Writes the evaluation files into ``out_dir`` and, when given, the HTML report to ``report_path``
    and the Markdown one to ``markdown_path``; returns ``(metrics, charts)``: ``charts`` holds the ROC curve's ``fpr``,
    ``tpr``, ``thresholds`` and the ``confusion`` summary (the arguments of ``report.log_kfp_metrics``).
    """
    cfg = from_dict(config)
    if cfg.eval.baseline and baseline_dir is None:
        baseline_dir = str(Path(out_dir) / "baseline")
        fit_baseline(data_dir, cfg.eval.baseline_rows, cfg.eval.baseline_features, baseline_dir)
    days = DayLedger(CheckpointStore(cfg.checkpoint.uri)).entries() if day_of(cfg) is not None else None
    with fetched_checkpoint(checkpoint_path, checkpoint_metadata, EVALUATION_PARTS) as (uri, ckpt_id, local):
        metrics = evaluate(local, data_dir, out_dir, cfg.eval, training=training_facts(checkpoint_metadata),
                           markdown_path=markdown_path, curve=(checkpoint_metadata or {}).get("curve"),
                           servers={**server_facts(checkpoint_metadata),
                                    **load_facts(cfg, data_dir, planned_shard_num(checkpoint_metadata))}, days=days,
                           baseline_dir=baseline_dir if cfg.eval.baseline else None,
                           warnings=tuple(w for w in [plaintext_warning(cfg, compose)] if w))
    record_evaluation(uri, ckpt_id, metrics)
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(out_dir) / "report.html", report_path)
    with np.load(Path(out_dir) / "roc.npz") as roc:
        charts = {name: roc[name] for name in ("fpr", "tpr", "thresholds")}
    charts["confusion"] = json.loads((Path(out_dir) / CONFUSION_FILE).read_text())
    return metrics, charts


