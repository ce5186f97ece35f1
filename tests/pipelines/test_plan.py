"""``plan=true`` prints what a run would do from the code the run uses, and starts and writes nothing."""

import math
import subprocess

import pytest

from components.config import from_dict
from components.data_prep.step import data_plan
from components.train.job import plan_lines, prepare_job
from pipelines.ctr import run
from pipelines.local import local_config
from tests.conftest import compose_config


@pytest.fixture
def no_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"plan=true started a process: {args}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


def test_plan_starts_nothing_and_writes_nothing(tmp_path, capsys, no_process):
    run_dir = tmp_path / "run"
    assert math.isnan(run(compose_config(run_dir, "plan=true", "experiment=tiny")))
    out = capsys.readouterr().out
    assert out.startswith("plan: ")
    assert not run_dir.exists()  # no checkpoint, no config.yaml, no kfp root (Hydra's own files aside)


def test_plan_numbers_are_the_prepared_jobs(tmp_path, capsys, no_process):
    overrides = ("plan=true", "ps.servers=3", "ps.workers=2", "data.shards_per_worker=2", "data.rows=5000")
    run(compose_config(tmp_path / "run", *overrides))
    lines = capsys.readouterr().out.splitlines()
    cfg = local_config(from_dict(compose_config(tmp_path / "run", *overrides)))
    # The job the train step would prepare (on a store of its own: preparing cleans the store it is given).
    job = prepare_job(cfg, None)
    for line in plan_lines(job.plan):
        assert f"  {line}" in lines
    assert "shard_num 24 (8 per server)" in "\n".join(lines)  # 3 servers
    plan = data_plan(cfg)
    [shards] = [line for line in lines if line.startswith("  shards")]
    assert f"{plan.num_shards} train shard(s), 2 per worker" in shards and plan.num_shards == 4
    [data] = [line for line in lines if line.startswith("  data")]
    assert "5,000 rows (3,500 train, 500 validation, 1,000 test)" in data
    [processes] = [line for line in lines if line.startswith("  processes")]
    assert processes.count("server-") == 3 and processes.count("worker-") == 2
