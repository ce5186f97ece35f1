"""The sparse-table planner: estimates, shard choice, the refusal of a table that cannot fit, and where it runs."""

import dataclasses
import json

import numpy as np
import pytest

from components.checkpoint.restore import RestoreTarget, restore_target
from components.checkpoint.store import CheckpointStore, make_id
from components.config import ConfigError, from_dict
from components.data_prep.prepare import prepare_synthetic
from components.ps import sharding
from components.train import planner
from components.train.job import JobResult, planned_config, prepare_job
from components.train.step import launch_ps_job, server_report, training_summary

GIB = planner.GIB


def _cfg(**groups):
    return from_dict({"run_dir": ".", **groups})


def _plan(cfg, distinct_ids=None, restore=None):
    """The memory plan as a prepared job makes it: the shard count resolved first."""
    planned, shard_source = planned_config(cfg, restore)
    return planner.plan_memory(planned, distinct_ids, shard_source)


def _restored(shard_num):
    return RestoreTarget("u", "i", resume=True, shard_num=shard_num)


@pytest.mark.parametrize("rule,dim,floats", [
    # SparseAccessor: slot, unseen_days, delta_score, show, click, embed_w + embed state + embedx + embedx state
    ("naive", 9, 6 + 0 + 8 + 0),
    ("adagrad", 9, 6 + 1 + 8 + 1),
    ("std_adagrad", 9, 6 + 1 + 8 + 8),
    ("adam", 9, 6 + 4 + 8 + 18),
    ("adagrad", 64, 6 + 1 + 63 + 1),
])
def test_row_layout_and_bytes_per_row(rule, dim, floats):
    table = _cfg(table={"rule": rule, "embedding_dim": dim}).table
    assert planner.row_floats(table) == floats
    assert planner.bytes_per_row(table) == floats * 4 + planner.ROW_OVERHEAD_BYTES


def test_rows_are_the_smaller_bound():
    assert planner.table_rows(1 << 20, None) == (1 << 20, "table.vocab_size")
    assert planner.table_rows(1 << 20, 5000) == (5000, "distinct train ids in stats.json")
    assert planner.table_rows(1000, 5000) == (1000, "table.vocab_size")
    assert planner.distinct_train_ids({"distinct_ids": {"C1": 10, "C2": 32}}) == 42
    assert planner.distinct_train_ids(None) is None


def test_default_shard_num_is_a_multiple_of_the_servers():
    assert planner.resolve_shard_num(None, 3) == (24, "8 per server")
    assert sharding.shards_per_server(24, 3) == [8, 8, 8]
    # What a fixed 16 would do on 3 servers: Paddle gives each ceil(16/3) = 6 shards while they last.
    assert sharding.shards_per_server(16, 3) == [6, 6, 4]
    assert sharding.shards_per_server(2, 3) == [1, 1, 0]
    assert planner.resolve_shard_num(10, 3) == (10, "table.shard_num")


def test_a_restored_table_keeps_its_shard_count():
    assert planner.resolve_shard_num(None, 3, saved=16) == (16, "as saved in the checkpoint")
    assert planner.resolve_shard_num(16, 3, saved=16)[0] == 16
    with pytest.raises(ConfigError) as err:
        planner.resolve_shard_num(24, 3, saved=16, saved_in="checkpoint X")
    assert err.value.key == "table.shard_num" and "16" in str(err.value) and "checkpoint X" in str(err.value)


def test_rows_go_to_the_server_owning_their_shard():
    ids = np.arange(48, dtype=np.uint64)
    # 16 shards on 2 servers: shards 0-7 on server 0, 8-15 on server 1 (files part-000-0000[0-7], part-001-...)
    assert sharding.server_of(ids, 16, 2).tolist() == [0] * 8 + [1] * 8 + [0] * 8 + [1] * 8 + [0] * 8 + [1] * 8
    assert sharding.rows_per_server(ids, 16, 3) == [18, 18, 12]
    files = {"tables/000/part-000-00003.gz": {"size": 5}, "tables/000/part-001-00009.gz": {"size": 7},
             "tables/000/part-001-00010.gz": {"size": 1}, "tables/001/part-000.gz": {"size": 100}}  # dense slice
    assert sharding.saved_bytes_per_server(files, 2) == [5, 8]
    assert planner.max_over_mean([10, 10, 13]) == pytest.approx(13 / 11)


def test_plan_per_server_and_budget_sources():
    cfg = _cfg(ps={"servers": 3}, table={"vocab_size": 3_000_000, "shard_num": 16})
    plan = _plan(cfg)
    assert plan.largest_server_rows == 3_000_000 * 6 // 16  # the servers owning 6 of the 16 shards
    bytes_per_row, base = planner.bytes_per_row(cfg.table), planner.server_base_bytes(cfg.table)
    assert plan.server_bytes == plan.largest_server_rows * bytes_per_row + base
    assert plan.budget_bytes is None and plan.fits
    assert planner.memory_budget(_cfg(ps={"memory_budget_gb": 1.5})) == (1.5 * GIB, "ps.memory_budget_gb")
    on_k8s = _cfg(cluster={"runner": "kubeflow", "backend": "jobset", "servers": {"memory": "12Gi"}})
    assert planner.memory_budget(on_k8s) == (12 * GIB, "cluster.servers.memory=12Gi")
    assert _plan(_cfg(ps={"mode": "geo"})) is None
    lines = "\n".join(plan.lines())
    assert "3,000,000 rows (table.vocab_size" in lines and "shard_num 16 (table.shard_num)" in lines


def test_a_table_that_cannot_fit_is_refused_with_the_numbers_and_the_fixes():
    cfg = _cfg(table={"vocab_size": 100_000_000, "embedding_dim": 16}, ps={"servers": 2, "memory_budget_gb": 8})
    plan = _plan(cfg)
    assert not plan.fits
    with pytest.raises(ConfigError) as err:
        planner.check_fits(cfg, plan)
    message = str(err.value)
    assert err.value.key == "ps.servers" and err.value.value == 2
    assert "100,000,000 rows (table.vocab_size)" in message and f"{plan.bytes_per_row} B/row" in message
    assert f"{plan.server_bytes / GIB:.2f} GiB" in message and "8.00 GiB each (ps.memory_budget_gb)" in message
    # Every fix it names really fits, and one server fewer would not.
    servers = int(message.split("ps.servers=")[1].split()[0])
    fits = _plan(dataclasses.replace(cfg, ps=dataclasses.replace(cfg.ps, servers=servers)))
    too_few = _plan(dataclasses.replace(cfg, ps=dataclasses.replace(cfg.ps, servers=servers - 1)))
    assert fits.fits and not too_few.fits
    dim = int(message.split("table.embedding_dim=")[1].split()[0])
    smaller = _plan(dataclasses.replace(cfg, table=dataclasses.replace(cfg.table, embedding_dim=dim)))
    wider = _plan(dataclasses.replace(cfg, table=dataclasses.replace(cfg.table, embedding_dim=dim + 1)))
    assert smaller.fits and not wider.fits
    assert "table=ssd" in message and "does not help" in message


def test_a_budget_below_the_server_base_names_it():
    cfg = _cfg(ps={"memory_budget_gb": 0.1})
    with pytest.raises(ConfigError) as err:
        planner.check_fits(cfg, _plan(cfg))
    assert "ps.servers=" not in str(err.value) and "a budget above the" in str(err.value)


def test_distinct_ids_decide_what_fits():
    """A table whose vocab_size alone could not fit passes when the data holds fewer distinct ids."""
    cfg = _cfg(table={"vocab_size": 1 << 30}, ps={"memory_budget_gb": 2})
    with pytest.raises(ConfigError):
        planner.check_fits(cfg, _plan(cfg))
    plan = _plan(cfg, planner.distinct_train_ids({"distinct_ids": {"C1": 1_000_000}}))
    assert plan.rows == 1_000_000 and plan.fits


def test_refused_before_any_process_starts(tmp_path, monkeypatch):
    prepare_synthetic(tmp_path / "data", rows=500, test_fraction=0.2, num_shards=1, vocab_size=1 << 20, seed=1)
    started = []
    monkeypatch.setattr("subprocess.Popen", lambda *a, **k: started.append(a))
    cfg = from_dict({"ps": {"servers": 1, "workers": 1, "memory_budget_gb": 0.2}, "run_dir": str(tmp_path),
                     "checkpoint": {"uri": str(tmp_path / "ckpt")}})
    with pytest.raises(ConfigError, match="ps.servers"):
        launch_ps_job(cfg, tmp_path / "data", tmp_path / "logs")
    assert started == []


def test_job_spec_carries_the_resolved_shard_num(tmp_path):
    cfg = _cfg(ps={"servers": 3}, checkpoint={"uri": str(tmp_path / "ckpt")})
    assert prepare_job(cfg, None).spec("d", "w", "s").config["table"]["shard_num"] == 24
    assert planned_config(cfg, _restored(16))[0].table.shard_num == 16


def test_the_restore_target_carries_the_saved_shard_count(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    ckpt_id = make_id(1, 10)
    (tmp_path / "staged").mkdir()
    (tmp_path / "staged" / "x.txt").write_text("x")
    store.commit(ckpt_id, store.upload_dir(tmp_path / "staged", ckpt_id), {"table": {"shard_num": 12}})
    restore = restore_target(store, "latest", None)
    assert restore.shard_num == 12
    with pytest.raises(ConfigError, match="table.shard_num"):
        planned_config(_cfg(table={"shard_num": 16}), restore)


def test_train_step_reports_the_load_and_records_it():
    plan = _plan(_cfg())
    checkpoint = {"id": "c1", "epoch": 1, "uri": "u", "servers": {"rows": [100, 120], "saved_bytes": [1000, 1200]}}
    memory = [{"serving_rss": GIB // 4, "peak_rss": GIB // 2}, {"serving_rss": GIB // 4, "peak_rss": GIB // 2}]
    result = JobResult(epochs=[{"epoch": 1, "examples": 10, "seconds": 1.0, "auc": 0.7}], seconds=2.0,
                       checkpoints=[checkpoint], restored_from=None, plan=plan, server_memory=memory)
    lines = server_report(result)
    assert "rows 100 | 120 (largest 1.091x the mean)" in lines[0]
    assert "saved shards 0.0 MiB | 0.0 MiB" in lines[1] and "peak 512.0 MiB | 512.0 MiB" in lines[2]
    summary = training_summary(result, "u")
    assert summary["server_rows"] == [100, 120] and summary["server_rows_max_over_mean"] == pytest.approx(1.0909)
    assert summary["memory_plan"]["shard_num"] == 16 and summary["server_peak_rss_gib"] == [0.5, 0.5]
    json.dumps(summary)  # the Model artifact's metadata


def test_more_servers_keep_a_restored_shard_count():
    """16 restored shards on 3 servers are 6 + 6 + 4: the fix names the fullest server's bytes, not the mean's."""
    cfg = _cfg(table={"vocab_size": 100_000_000, "embedding_dim": 16}, ps={"servers": 2, "memory_budget_gb": 8})
    plan = _plan(cfg, restore=_restored(16))
    with pytest.raises(ConfigError) as err:
        planner.check_fits(cfg, plan)
    servers = int(str(err.value).split("ps.servers=")[1].split()[0])
    more = dataclasses.replace(cfg, ps=dataclasses.replace(cfg.ps, servers=servers))
    fits = _plan(more, restore=_restored(16))
    assert fits.fits and fits.shard_num == 16
    assert f"{fits.server_bytes / GIB:.2f} GiB on the fullest" in str(err.value)
