"""What a role process does before Paddle starts: the pod's copy of the dataset and of the fitted baseline, the
configuration error status."""

import dataclasses

import pytest

from components.config import to_dict
from components.data_prep.prepare import prepare_synthetic
from components.ps.contract import CONFIG_ERROR_EXIT, SPEC_ENV, JobPlan, JobSpec
from components.networks.models import FittedBaseline
from components.ps.job_inputs import fetch_baseline, fetch_dataset


def test_a_pod_fetches_the_dataset_files_its_role_reads(tmp_path, monkeypatch):
    stats = prepare_synthetic(tmp_path / "remote", rows=2000, test_fraction=0.2, num_shards=4, vocab_size=1000, seed=1)
    uri = (tmp_path / "remote").as_uri()  # file://..., fetched through fsspec like s3://...
    monkeypatch.setenv("TRAINING_ROLE", "PSERVER")
    server = fetch_dataset(uri, tmp_path / "server")
    assert sorted(p.name for p in server.rglob("*") if p.is_file()) == ["stats.json"]
    monkeypatch.setenv("TRAINING_ROLE", "TRAINER")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    worker = fetch_dataset(uri, tmp_path / "worker-1")
    fetched = sorted(str(p.relative_to(worker)) for p in worker.rglob("*") if p.is_file() and p.name != "stats.json")
    # Its train shards, and its share of the splits every worker scores at each checkpoint.
    assert fetched == sorted(stats["shards"]["train"][1::2] + stats["shards"]["valid"][1::2]
                             + stats["shards"]["test"][1::2])
    assert stats["shards"]["valid"][1::2] and stats["shards"]["test"][1::2]
    for rel in fetched:
        assert (worker / rel).read_bytes() == (tmp_path / "remote" / rel).read_bytes()


def test_a_worker_fetches_the_fitted_baseline(tmp_path):
    import numpy as np

    (tmp_path / "remote").mkdir()
    FittedBaseline(np.arange(4.0), np.array([0.5]), -1.25, -0.7).save(tmp_path / "remote")
    local = fetch_baseline((tmp_path / "remote").as_uri(), tmp_path / "worker-0" / "baseline")
    fetched = FittedBaseline.load(local)
    assert fetched.weights.tolist() == [0.0, 1.0, 2.0, 3.0] and fetched.dense_weights.tolist() == [0.5]
    assert (fetched.bias, fetched.logit_shift) == (-1.25, -0.7)


def _role(tmp_path, spec: str):
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT), SPEC_ENV: spec, "TRAINING_ROLE": "TRAINER"}
    return subprocess.run([sys.executable, "-m", "components.ps.role"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


# What a launcher resolves for a fresh job on 2 servers (components.train.planner.job_plan).
FRESH_PLAN = JobPlan(shard_num=16, shard_source="8 per server", negative_sample_rate=1.0)


def _spec(config: dict, tmp_path) -> str:
    return JobSpec(config=config, plan=FRESH_PLAN, data_dir=str(tmp_path / "data"), workdir=str(tmp_path / "work"),
                   staging_dir=str(tmp_path / "staging")).to_json()


@pytest.mark.parametrize("case", ["invalid value", "unknown key", "not a job spec"])
def test_a_role_whose_config_cannot_work_exits_with_the_config_error_status(tmp_path, config, case):
    """Before it touches storage or starts Paddle: the launchers then fail the job at once, naming the reason."""
    good = to_dict(config())
    if case == "invalid value":
        spec, reason = _spec({**good, "ps": {**good["ps"], "workers": 0}}, tmp_path), "config key 'ps.workers'"
    elif case == "unknown key":
        spec, reason = _spec({**good, "ps": {**good["ps"], "wrokers": 2}}, tmp_path), "Key 'wrokers' not in 'PsConfig'"
    else:
        spec, reason = "{not json", f"config key '${SPEC_ENV}'"
    proc = _role(tmp_path, spec)
    assert proc.returncode == CONFIG_ERROR_EXIT, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("configuration error: ") and reason in line
    assert not (tmp_path / "work").exists()  # nothing fetched or written


def test_a_restarted_role_resumes_the_newest_checkpoint_of_the_run_its_driver_names(tmp_path, monkeypatch):
    """A compose file is written once and run many times: its job spec names no run, the driver names each one
    (PS_RUN_ID) and counts its attempts (PS_RESTART_ATTEMPT); a restarted attempt resumes only that run's newest
    checkpoint, never an earlier run's left in the same store."""
    from components.checkpoint.restore import STATE_FILE, RestoreTarget
    from components.checkpoint.store import CheckpointStore, make_id
    from components.config import CtrConfig
    from components.ps.contract import RESTART_ENV, RUN_ID_ENV
    from components.ps.job_inputs import load_job
    from components.train.planner import job_plan

    store = CheckpointStore(str(tmp_path / "ckpt"))
    staged = tmp_path / "staged"
    staged.mkdir()

    def commit(epoch: int, run_id: str) -> str:
        ckpt_id = make_id(epoch, 100)
        (staged / STATE_FILE).write_text(f'{{"run_id": "{run_id}"}}')
        store.commit(ckpt_id, store.upload_dir(staged, ckpt_id), {})
        return ckpt_id

    commit(3, "ctr-ps-earlier")
    own = commit(1, "ctr-ps-this")
    cfg = CtrConfig(checkpoint=dataclasses.replace(CtrConfig().checkpoint, uri=store.uri))
    plan = job_plan(cfg)
    spec = tmp_path / "spec.json"
    spec.write_text(JobSpec(config=to_dict(cfg), plan=plan, data_dir=str(tmp_path / "data"),
                            workdir=str(tmp_path / "work"), staging_dir=str(tmp_path / "staging")).to_json())
    monkeypatch.setenv(RUN_ID_ENV, "ctr-ps-this")
    monkeypatch.setenv(RESTART_ENV, "0")
    job, _ = load_job(str(spec))
    assert job.restore is None and job.run_id == "ctr-ps-this"  # the first attempt starts fresh, under the run's name
    monkeypatch.setenv(RESTART_ENV, "1")
    job, _ = load_job(str(spec))
    assert job.restore == RestoreTarget(store.uri, own, resume=True, shard_num=plan.shard_num)  # the plan's count
