"""``plan=true`` prints what a run would do from the code the run uses, and starts and writes nothing."""

import math
import subprocess

import pytest
import yaml

from components.config import from_dict
from components.data_prep.step import data_plan
from components.train import planner, process_plan
from components.train.job import plan_lines, prepare_job
from pipelines.ctr import run
from pipelines.local import local_config
from tests.conftest import committed_checkpoints, compose_config


@pytest.fixture
def no_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"plan=true started a process: {args}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


def test_plan_starts_nothing_and_writes_nothing(tmp_path, capsys, no_process):
    run_dir = tmp_path / "run"
    result = run(compose_config(run_dir, "plan=true", "experiment=tiny"))
    assert result.metrics == {} and result.report is None and result.checkpoint is None  # nothing measured or made
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
    for line in plan_lines(job.plan.memory):
        assert f"  {line}" in lines
    assert "shard_num 24 (8 per server)" in "\n".join(lines)  # 3 servers
    plan = data_plan(cfg)
    [shards] = [line for line in lines if line.startswith("  shards")]
    assert f"{plan.num_shards} train shard(s), 2 per worker" in shards and plan.num_shards == 4
    [data] = [line for line in lines if line.startswith("  data")]
    assert "5,000 rows (3,500 train, 500 validation, 1,000 test)" in data
    [processes] = [line for line in lines if line.startswith("  processes")]
    assert processes.count("server-") == 3 and processes.count("worker-") == 2


def _plan_lines(tmp_path, capsys, *overrides):
    run(compose_config(tmp_path / "run", "plan=true", *overrides))
    return capsys.readouterr().out.splitlines()


def _process_line(lines, kind):
    [line] = [line for line in lines if line.startswith(f"  process plan: {kind} x")]
    return line


def test_plan_prints_every_process_from_the_planner(tmp_path, capsys, no_process):
    overrides = ("ps.servers=3", "ps.workers=2", "data.rows=5000")
    lines = _plan_lines(tmp_path, capsys, *overrides)
    cfg = local_config(from_dict(compose_config(tmp_path / "run", "plan=true", *overrides)))
    job = prepare_job(cfg, None)
    plan = process_plan.plan_processes(job.cfg, process_plan.data_shape(job.cfg), job.plan)
    for line in plan.lines():
        assert f"  {line}" in lines
    for kind in ("server", "worker", "evaluate", "export", "serving"):
        assert _process_line(lines, kind)
    # 5,000 rows: 1,000 test rows in 2 shard files, 500 a worker.
    assert "its share of the test split (500 rows x 476 B)" in _process_line(lines, "worker")
    server = _process_line(lines, "server")
    assert server.startswith(f"  process plan: server x3: {planner.size(job.plan.memory.server_bytes)}")


@pytest.mark.parametrize("vocab", [1 << 20, 1 << 23])
def test_a_geo_workers_line_grows_with_vocab_size(tmp_path, capsys, no_process, vocab):
    worker = _process_line(_plan_lines(tmp_path, capsys, "ps.mode=geo", f"table.vocab_size={vocab}"), "worker")
    copies = process_plan.GEO_TABLE_COPIES * vocab * 9 * 4
    assert (f"{planner.size(copies)} geo: dense copies of the table (vocab_size {vocab:,} x dim 9 x 4 B x "
            f"{process_plan.GEO_TABLE_COPIES})") in worker
    plain = _process_line(_plan_lines(tmp_path, capsys, f"table.vocab_size={vocab}"), "worker")
    assert "geo" not in plain and plain.split(" = ")[1] in worker  # the same parts, and the table's copies


@pytest.mark.parametrize("vocab,shard_num", [(1 << 20, 16), (3_000_000, 7)])
def test_the_export_line_follows_rows_over_shard_num(tmp_path, capsys, no_process, vocab, shard_num):
    lines = _plan_lines(tmp_path, capsys, f"table.vocab_size={vocab}", f"table.shard_num={shard_num}")
    largest = -(-vocab // shard_num)
    assert (f"{planner.size(largest * 44 * process_plan.EXPORT_PARSE_FACTOR)} the largest shard ({vocab:,} rows / "
            f"shard_num {shard_num} = {largest:,} rows x 44 B parsed x {process_plan.EXPORT_PARSE_FACTOR})") in \
        _process_line(lines, "export")
    single = _process_line(_plan_lines(tmp_path, capsys, f"table.vocab_size={vocab}", "export.format=single"), "export")
    assert (f"{planner.size(vocab * 44 * process_plan.EXPORT_PARSE_FACTOR)} the whole table ({vocab:,} rows x 44 B parsed"
            f" x {process_plan.EXPORT_PARSE_FACTOR})") in single


KUBEFLOW = ("+cluster=prod", "checkpoint.uri=s3://ctr-bucket/plan/checkpoints", "cluster.submit=false")


def test_kubeflow_steps_request_the_larger_of_the_config_and_the_plan(tmp_path, capsys, no_process):
    """The compiled export step requests what plan=true says: its configured memory, or the plan's when larger."""
    from pipelines.pipeline import compile_pipeline

    for overrides, export in ((KUBEFLOW, "4Gi"), ((*KUBEFLOW, f"table.vocab_size={1 << 28}", "export.format=single"),
                                                  None)):
        cfg = from_dict(compose_config(tmp_path / "run", *overrides))
        memories = process_plan.step_memories(cfg)
        plan = process_plan.compile_time_plan(cfg)
        expected = export or f"{math.ceil(plan.process('export').bytes * process_plan.PLAN_MARGIN / planner.GIB)}Gi"
        assert memories["export"][0] == expected and memories["evaluate"][0] == "8Gi"
        [steps] = [line for line in _plan_lines(tmp_path, capsys, *overrides) if line.startswith("  steps")]
        assert f"export {expected} (" in steps and "evaluate 8Gi (cluster.steps.evaluate.memory)" in steps
        compile_pipeline(cfg, tmp_path / "pipeline.yaml")
        spec = next(yaml.safe_load_all((tmp_path / "pipeline.yaml").read_text()))
        executors = spec["deploymentSpec"]["executors"]
        resources = executors["exec-export-model"]["container"]["resources"]
        assert resources["resourceMemoryRequest"] == resources["resourceMemoryLimit"] == expected
        assert executors["exec-evaluate-model"]["container"]["resources"]["resourceMemoryLimit"] == "8Gi"


def test_plan_says_a_corrupt_newest_checkpoint_gives_way_to_the_intact_one_before_it(tmp_path, capsys, no_process):
    intact, newest = committed_checkpoints(tmp_path, 2)
    manifest = newest / "MANIFEST.json"
    manifest.write_bytes(manifest.read_bytes()[:100])  # half-written
    lines = _plan_lines(tmp_path, capsys, "experiment=tiny", f"checkpoint.uri={intact.parent}",
                        "checkpoint.resume=latest", "ps.epochs=3")
    [warning] = [line for line in lines if "warning" in line]
    assert warning.startswith(f"warning: checkpoint {newest.name} in {intact.parent} is corrupt (")
    assert "MANIFEST.json is not valid JSON" in warning and f"resuming from {intact.name} instead" in warning
    [checkpoint] = [line for line in lines if line.startswith("  checkpoint  ")]
    assert f"resuming from checkpoint {intact.name}" in checkpoint


def test_plan_of_a_daily_run_is_its_first_untrained_day(tmp_path, capsys, no_process):
    from components.data_prep.drifting import DriftingSpec, write_days
    from components.data_prep.synthetic import DEFAULT_CARDINALITIES

    write_days(tmp_path / "logs", DriftingSpec(days=2, rows_per_day=500,
                                               cardinalities=tuple(min(c, 50) for c in DEFAULT_CARDINALITIES)))
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # as Hydra makes it: the plan removes it again (not the planned day's directory, never made)
    run(compose_config(run_dir, "plan=true", "data=criteo", "experiment=tiny",
                       f"data.uri='{tmp_path / 'logs'}/day_{{day}}.tsv'", "data.days=[0,1]"))
    out = capsys.readouterr().out
    assert out.startswith("days: 0 of data.days trained already, 2 to train ['0', '1']; the plan of day '0'")
    assert "day_0.tsv" in out and "day_1.tsv" not in out
    assert not run_dir.exists()
