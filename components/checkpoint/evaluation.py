"""``EVALUATION.json`` at the root of a checkpoint store: the test metrics of the checkpoint evaluated last.

The evaluate step writes it beside the checkpoints, so whoever knows only a run's checkpoint URI (a sweep
waiting on Kubeflow runs, :mod:`pipelines.kubeflow`) reads the run's objective there.
"""

from __future__ import annotations

from typing import Optional

from components.checkpoint.store import CheckpointStore

EVALUATION_FILE = "EVALUATION.json"


def record_evaluation(store_uri: str, ckpt_id: str, metrics: dict) -> None:
    CheckpointStore(store_uri).write_json(None, EVALUATION_FILE, {"checkpoint": ckpt_id, "metrics": metrics})


def read_evaluation(store_uri: str) -> Optional[dict]:
    """What :func:`record_evaluation` wrote last into the store, or None."""
    return CheckpointStore(store_uri).read_json(None, EVALUATION_FILE)
