"""What :func:`pipelines.ctr.run` returns (README: the Python API)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


@dataclass(frozen=True)
class RunResult:
    """One run of the pipeline, as the code that ran it knows it.

    ``metrics``: the test metrics (``metrics.json``: ``auc``, ``logloss``, ``ne``, ``calibration``, ``ece``, the
    baseline's ``baseline_auc`` and ``lift_auc``, ...); ``{}`` when nothing was measured here (``plan=true``, a
    Kubeflow run submitted without ``cluster.wait=true``, a daily run whose days were all trained already).
    ``run_dir``: the run directory. ``report``: the HTML report this run wrote into it, else None (a Kubeflow run's
    report is an artifact of its evaluate step). ``checkpoint``: the id of the checkpoint the run delivered, in the
    store ``checkpoint.uri`` (``run_dir/config.yaml``), else None.
    """

    metrics: dict[str, Any]
    run_dir: Path
    report: Optional[Path] = None
    checkpoint: Optional[str] = None

    @property
    def test_auc(self) -> Optional[float]:
        """The test AUC; None when nothing was measured."""
        return self.metrics.get("auc")
