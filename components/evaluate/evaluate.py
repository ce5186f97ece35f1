"""Scores the test split with a model loaded from a committed checkpoint (never the in-memory model).

The network is rebuilt from ``model.json`` with a local embedding table holding the exported rows;
ids the servers never saw map to a zero row (the PS would create them with near-zero weights).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np

from components import checkpoint as ckpt_io
from components.config import EvalConfig, from_dict
from components.data_prep.multislot import RaggedIds, Schema, read_shards
from components.evaluate import metrics as metric_fns
from components.evaluate import report
from components.train import models
from components.train.strategy import EMBEDDING_TABLE

SCORE_BATCH = 8192


class Scorer:
    """A checkpoint's model as a local Paddle program: ``predict(dense, sparse) -> probabilities``."""

    def __init__(self, checkpoint: ckpt_io.Checkpoint):
        import paddle

        paddle.enable_static()
        self.paddle = paddle
        self.ids = checkpoint.ids
        self.schema = Schema.from_dict(checkpoint.meta["schema"])
        model_cfg = from_dict({"model": checkpoint.meta["model"]}).model
        dim = checkpoint.rows.shape[1]
        table = np.vstack([checkpoint.rows, np.zeros((1, dim), np.float32)])  # last row: unseen ids
        self.main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(self.main, startup), paddle.utils.unique_name.guard():
            self.feeds = models.create_feeds(self.schema)

            def lookup(slot):
                return paddle.static.nn.embedding(slot, size=list(table.shape),
                                                  param_attr=paddle.ParamAttr(name=EMBEDDING_TABLE))

            self.prob = paddle.nn.functional.sigmoid(models.net(model_cfg, self.feeds, lookup, dim))
        self.scope = paddle.static.Scope()
        self.exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(self.scope):
            self.exe.run(startup)
        params = {**checkpoint.dense, EMBEDDING_TABLE: table}
        missing = [p.name for p in self.main.all_parameters() if p.name not in params]
        if missing:
            raise ckpt_io.CheckpointError(f"checkpoint lacks parameters {missing} of model {model_cfg.name.value}")
        for p in self.main.all_parameters():
            self.scope.find_var(p.name).get_tensor().set(params[p.name], paddle.CPUPlace())

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        """Global feature ids -> row indices of the local table (unseen ids -> the zero row)."""
        pos = np.searchsorted(self.ids, ids.astype(np.uint64))
        pos = np.minimum(pos, len(self.ids) - 1)
        return np.where(self.ids[pos] == ids.astype(np.uint64), pos, len(self.ids)).astype(np.int64)

    def predict(self, dense: np.ndarray, sparse: list[RaggedIds]) -> np.ndarray:
        n = len(sparse[0].offsets) - 1 if sparse else len(dense)
        out = np.empty(n, dtype=np.float32)
        for start in range(0, n, SCORE_BATCH):
            stop = min(start + SCORE_BATCH, n)
            feed: dict[str, Any] = {}
            if self.feeds.dense is not None:
                feed[self.feeds.dense.name] = dense[start:stop]
            for var, slot in zip(self.feeds.sparse, sparse):
                lo, hi = slot.offsets[start], slot.offsets[stop]
                tensor = self.paddle.base.core.LoDTensor()
                tensor.set(self._rows(slot.values[lo:hi]).reshape(-1, 1), self.paddle.CPUPlace())
                tensor.set_lod([(slot.offsets[start:stop + 1] - lo).tolist()])
                feed[var.name] = tensor
            with self.paddle.static.scope_guard(self.scope):
                (prob,) = self.exe.run(self.main, feed=feed, fetch_list=[self.prob])
            out[start:stop] = np.asarray(prob).ravel()
        return out


def evaluate(checkpoint_dir: str | os.PathLike, data_dir: str | os.PathLike, out_dir: str | os.PathLike,
             cfg: EvalConfig, training: Optional[dict] = None) -> dict[str, Any]:
    """Metrics of the checkpoint on the test split; writes metrics.json, roc.png, report.md/html."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = ckpt_io.load(checkpoint_dir)
    stats = json.loads((Path(data_dir) / "stats.json").read_text())
    schema = Schema.from_dict(stats["schema"])
    if schema.to_dict() != checkpoint.meta["schema"]:
        raise ckpt_io.CheckpointError(f"checkpoint {checkpoint_dir} was trained on another feature schema "
                                      f"than the data in {data_dir}")
    labels, dense, sparse = read_shards([Path(data_dir) / p for p in stats["shards"]["test"]], schema)
    preds = Scorer(checkpoint).predict(dense, sparse)
    result = metric_fns.binary_metrics(labels, preds)
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
    report.write_report(out / "report.md", result, roc_png_name="roc.png", **kwargs)
    report.write_report_html(out / "report.html", result, roc_png_path=out / "roc.png", **kwargs)
    ckpt_io.write_json_atomic(out / "metrics.json", result)
    np.savez(out / "roc.npz", fpr=fpr, tpr=tpr, thresholds=thresholds)
    return result
