"""Worker 0's judgement of each checkpoint on the validation split: its metrics, its calibration, whether it is the
best so far, and when to stop.

A checkpoint is scored the way the evaluation scores the delivered model (:class:`components.ps.scoring.Scorer`, on
the export the checkpoint holds), so "best on the validation split" means best as delivered. The calibration (Platt
scaling, :func:`components.evaluate.metrics.fit_platt`) is fitted on the same predictions and travels in the
checkpoint's ``model.json``: evaluation, export and serving all apply the one the delivered checkpoint carries.

Early stopping: the job stops once ``ps.patience`` checkpoints in a row did not improve the objective
(``objective``: AUC up or logloss down) on the validation split; ``ps.epochs`` is then a maximum. The store's
``BEST`` pointer names the best checkpoint, which pruning keeps and the train step delivers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from components.checkpoint.format import Checkpoint
from components.config import Calibration, CtrConfig
from components.data_prep.multislot import Schema, read_shards
from components.evaluate.metrics import binary_metrics, fit_platt
from components.ps.scoring import Scorer

# Whether a larger value of the objective is better.
MAXIMIZE = {"auc": True, "logloss": False}


@dataclass(frozen=True)
class Verdict:
    metrics: dict[str, Any]  # the checkpoint's validation metrics
    calibration: Optional[dict[str, Any]]  # fitted on them (None: calibration is off)
    best: bool  # the best checkpoint so far
    stop: bool  # no improvement for ps.patience checkpoints: end the job


class EarlyStopping:
    """The best validation value so far and how many checkpoints since it; restored from a checkpoint's state."""

    def __init__(self, objective: str, patience: int, state: Optional[dict] = None):
        self.objective, self.patience = objective, patience
        state = state or {}
        self.best_id: Optional[str] = state.get("best_id")
        self.best_value: Optional[float] = state.get("best_value")
        self.stale = int(state.get("stale", 0))

    def judge(self, ckpt_id: str, value: float) -> tuple[bool, bool]:
        """``(is the new best, stop now)`` after the checkpoint ``ckpt_id`` scored ``value``."""
        better = self.best_value is None or (value > self.best_value if MAXIMIZE[self.objective]
                                             else value < self.best_value)
        if better and math.isfinite(value):
            self.best_id, self.best_value, self.stale = ckpt_id, value, 0
        else:
            self.stale += 1
        return better, self.stale >= self.patience

    def state(self) -> dict:
        return {"best_id": self.best_id, "best_value": self.best_value, "stale": self.stale}


class Validator:
    """Scores checkpoints on the validation split of ``data_dir`` (read once, kept in memory)."""

    def __init__(self, cfg: CtrConfig, data_dir: Path, stats: dict, stopping: EarlyStopping):
        self.cfg, self.stopping = cfg, stopping
        schema = Schema.from_dict(stats["schema"])
        paths = [Path(data_dir) / rel for rel in stats["shards"]["valid"]]
        self.labels, self.dense, self.sparse = read_shards(paths, schema)

    @classmethod
    def of(cls, cfg: CtrConfig, data_dir: Path, stats: dict, state: dict) -> Optional["Validator"]:
        """The validator of a dataset with a validation split that has both classes (else None: no validation)."""
        if not stats.get("rows", {}).get("valid"):
            return None
        validator = cls(cfg, data_dir, stats, EarlyStopping(cfg.objective, cfg.ps.patience, state.get("stopping")))
        return validator if 0 < validator.labels.sum() < len(validator.labels) else None

    def judge(self, ckpt_id: str, checkpoint: Checkpoint) -> Verdict:
        preds = Scorer(checkpoint).predict(self.dense, self.sparse)
        metrics = binary_metrics(self.labels, preds)
        calibration = (fit_platt(self.labels, preds) if self.cfg.eval.calibration is Calibration.platt else None)
        best, stop = self.stopping.judge(ckpt_id, metrics[self.cfg.objective])
        return Verdict({k: metrics[k] for k in ("auc", "logloss", "calibration", "count")}, calibration, best, stop)

    def state(self) -> dict:
        return self.stopping.state()
