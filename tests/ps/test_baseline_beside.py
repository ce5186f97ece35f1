"""A job whose baseline is fitted beside it (Kubeflow's fit-baseline running beside the train step): its workers
train without it, wait for it at their first checkpoint, and judge and keep every checkpoint with it."""

import json
import threading
import time

import numpy as np
import pytest

from components.checkpoint import format as ckpt_io
from components.checkpoint.store import CheckpointStore
from components.config import from_dict
from components.data_prep.prepare import prepare_synthetic
from components.evaluate.baseline_step import fit_baseline
from components.networks import models
from components.networks.baseline_handoff import publish_failure
from components.storage import Storage
from components.train.job import RoleFailed
from components.train.step import Baseline, launch_ps_job

WAITING = "waiting for the baseline fitted beside this job"


def _job(tmp_path, **cluster):
    prepare_synthetic(tmp_path / "data", rows=6_000, test_fraction=0.2, valid_fraction=0.2, num_shards=2,
                      vocab_size=1 << 16, seed=4)
    cfg = from_dict({"ps": {"servers": 1, "workers": 2, "epochs": 2, "batch_size": 64},
                     "eval": {"baseline_rows": 4_000, "baseline_features": 1 << 12},
                     "checkpoint": {"uri": str(tmp_path / "ckpt"), "keep_last": 5}, "cluster": cluster,
                     "run_dir": str(tmp_path)})
    return cfg, Baseline.fitted_beside(cfg, cfg.checkpoint.uri, f"minio://kfp/{tmp_path.name}/merge-data/dataset")


def _worker_logs(tmp_path) -> str:
    return "".join(p.read_text() for p in (tmp_path / "logs").rglob("worker-*.log"))


def test_the_workers_train_first_wait_for_the_fit_at_their_first_checkpoint_and_judge_on_the_blend(tmp_path):
    cfg, baseline = _job(tmp_path)
    fitted = {}

    def fit_once_a_worker_waits():  # the step beside the job: its fit arrives after the workers trained a pass
        deadline = time.monotonic() + 300
        while WAITING not in _worker_logs(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        fitted.update(fit_baseline(tmp_path / "data", 4_000, 1 << 12, tmp_path / "fit", handoff=baseline.uri))

    beside = threading.Thread(target=fit_once_a_worker_waits, daemon=True)
    beside.start()
    result = launch_ps_job(cfg, tmp_path / "data", tmp_path / "logs", echo=lambda line: None, baseline=baseline)
    beside.join(60)
    assert fitted and _worker_logs(tmp_path).count(WAITING) == 2  # each worker waited, once
    assert [c["epoch"] for c in result.checkpoints] == [1, 2]
    expected = models.baseline_values(str(tmp_path / "fit"))
    store = CheckpointStore(cfg.checkpoint.uri)
    for event in result.checkpoints:  # judged on the blend, and each holds the baseline it blends in
        local = store.download(event["id"], tmp_path / "got" / event["id"])
        meta = json.loads((local / ckpt_io.MODEL_META).read_text())
        assert meta["calibration"]["method"] == "blend" and "auc" in meta["validation"]
        with np.load(local / ckpt_io.EXPORT / ckpt_io.DENSE_FILE) as saved:
            for name, value in expected.items():
                np.testing.assert_array_equal(saved[name], value)


def test_a_failed_fit_fails_the_job_at_its_first_checkpoint_without_a_restart(tmp_path):
    cfg, baseline = _job(tmp_path, step_retries=0, max_restarts=2)
    publish_failure(Storage(baseline.uri), "MemoryError: the design matrix")
    with pytest.raises(RoleFailed, match="restarting cannot mend it") as failed:
        launch_ps_job(cfg, tmp_path / "data", tmp_path / "logs", echo=lambda line: None, baseline=baseline)
    assert "baseline unavailable: the baseline's fit beside this job failed: MemoryError: the design matrix" \
        in str(failed.value)
