"""Worker 0's judgement of each checkpoint on the validation split: its metrics, its calibration, whether it is the
best so far, and when to stop.

A checkpoint is scored through the servers by every worker (:mod:`components.ps.pull_scoring`), as its test split is,
and judged on the merged counts. A model that blends the baseline in (``model.blend_baseline``, the default) is
judged on its blended predictions, what it delivers: the blend is fitted on the same pass over the split
(:mod:`components.ps.checkpointing`). Otherwise on the network's own predictions, on which the calibration (Platt
scaling, :func:`components.calibration.fit_platt_counts`) is fitted: the AUC is the delivered model's (the calibration
keeps the order), the logloss the one before the calibration. The calibration or the blend travels in the
checkpoint's ``model.json``: evaluation, export and serving all apply the one the delivered checkpoint carries. All are
of the predictions corrected for negative downsampling (at the rate the data was prepared with, the job's plan's:
:class:`components.ps.contract.JobPlan`), which the programs apply before the calibration
(:mod:`components.networks.scoring`).

Early stopping: the job stops once ``ps.patience`` checkpoints in a row did not improve the objective
(``objective``: AUC up or logloss down) on the validation split; ``ps.epochs`` is then a maximum. The store's
``BEST`` pointer names the best checkpoint, which pruning keeps and the train step delivers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from components.config import Calibration, CtrConfig
from components.calibration import fit_platt_counts
from components.metrics import ScoreCounts, binary_metrics_counts

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
    """Judges checkpoints by their merged validation counts."""

    def __init__(self, cfg: CtrConfig, stopping: EarlyStopping):
        self.cfg, self.stopping = cfg, stopping

    @classmethod
    def of(cls, cfg: CtrConfig, stats: dict, state: dict) -> Optional["Validator"]:
        """The validator of a dataset whose validation split has both classes (else None: no validation)."""
        rows = stats.get("rows", {}).get("valid") or 0
        positives = round(rows * (stats.get("ctr", {}).get("valid") or 0))
        if not 0 < positives < rows:
            return None
        return cls(cfg, EarlyStopping(cfg.objective, cfg.ps.patience, state.get("stopping")))

    def judge(self, ckpt_id: str, counts: ScoreCounts, calibrate: bool = True) -> Verdict:
        """The verdict on a checkpoint that predicted ``counts`` (probabilities corrected for negative downsampling
        by the scoring program: :class:`components.networks.scoring.NetworkProgram`): the network's, uncalibrated,
        or a model's that blends the baseline in, through its blend. ``calibrate``: fit the configured calibration
        on them (not on a blend, which is the model's calibration)."""
        metrics = binary_metrics_counts(counts)
        platt = calibrate and self.cfg.eval.calibration is Calibration.platt
        calibration = fit_platt_counts(counts) if platt else None
        best, stop = self.stopping.judge(ckpt_id, metrics[self.cfg.objective])
        return Verdict({k: metrics[k] for k in ("auc", "logloss", "calibration", "count")}, calibration, best, stop)

    def state(self) -> dict:
        return self.stopping.state()
