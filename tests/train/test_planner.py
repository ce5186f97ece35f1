"""The sparse-table planner: estimates, shard choice, the refusal of a table that cannot fit, and where it runs; the
plans of every other process; the sizing table."""

import dataclasses
import json
import math

import numpy as np
import pytest

from components.checkpoint.restore import RestoreTarget, restore_target
from components.checkpoint.store import CheckpointStore, make_id
from components.config import ConfigError, ExportFormat, from_dict, to_dict
from components.data_prep.multislot import Schema, read_shards
from components.data_prep.prepare import prepare_synthetic
from components.table import sharding
from components.table.memory import SAVE_ROWS_PER_S
from components.train import planner, process_plan, sizing
from components.train.job import JobResult, prepare_job
from components.train.step import launch_ps_job, server_report, training_summary

GIB = planner.GIB


def _cfg(**groups):
    return from_dict({"run_dir": ".", **groups})


def _plan(cfg, distinct_ids=None, restore=None):
    """The memory plan as a prepared job makes it: the shard count resolved first."""
    plan = planner.job_plan(cfg, restore=restore)
    return planner.plan_memory(cfg, plan.shard_num, plan.shard_source, distinct_ids)


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
    # A table whose shards would exceed MAX_SHARD_ROWS gets more of them (the export holds one at a time).
    assert planner.resolve_shard_num(None, 2, rows=8 * 2 * planner.MAX_SHARD_ROWS) == (16, "8 per server")
    assert planner.resolve_shard_num(None, 2, rows=16_000_000) == (32, "16 per server: at most 500,000 rows a shard")
    assert planner.resolve_shard_num(None, 2, saved=16, rows=16_000_000)[0] == 16  # a restored table keeps its own


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
    # The servers save (and load) in parallel: the fullest one's rows at the measured rate per server.
    assert plan.save_s == plan.largest_server_rows / SAVE_ROWS_PER_S
    assert f"saves its rows in about {plan.save_s:,.0f}s" in lines and plan.summary()["save_s"] == round(plan.save_s, 1)


SEEN_AT_LEAST = {"1": 100_000, "2": 40_000, "3": 25_000, "5": 12_000, "10": 5_000, "20": 2_000, "50": 500,
                 "100": 100}


def test_admission_plans_full_rows_only_for_the_ids_that_reach_the_threshold():
    stats = {"distinct_ids": {"C1": 100_000}, "distinct_ids_seen_at_least": SEEN_AT_LEAST}
    every_row = _cfg(table={"shard_num": 8})
    admitted = _cfg(table={"shard_num": 8, "admission": {"embedx_threshold": 4}})
    full = planner.plan_memory(every_row, 8, "table.shard_num", 100_000, stats)
    plan = planner.plan_memory(admitted, 8, "table.shard_num", 100_000, stats)
    assert full.full_rows == 100_000 and full.bytes_per_row == planner.bytes_per_row(every_row.table)
    # Threshold 4 with the default coefficients (a show scores 1) and 1 pass: ids of >= 4 rows, counted as >= 3.
    assert plan.full_rows == 25_000
    short = planner.short_row_floats(admitted.table) * 4 + planner.ROW_OVERHEAD_BYTES
    assert plan.short_floats == 7 and plan.bytes_per_row == math.ceil(
        (25_000 * planner.bytes_per_row(admitted.table) + 75_000 * short) / 100_000)
    assert plan.server_bytes < full.server_bytes
    assert "25,000 full rows" in plan.lines()[0] and "ids seen in at least 3 train rows" in plan.lines()[0]
    # Two passes show every id twice: ids of 2 rows reach 4.
    twice = dataclasses.replace(admitted, ps=dataclasses.replace(admitted.ps, epochs=2))
    assert planner.plan_memory(twice, 8, "table.shard_num", 100_000, stats).full_rows == 40_000
    # Without the counts every row is planned full, and the plan says so.
    unknown = planner.plan_memory(admitted, 8, "table.shard_num", 100_000,
                                  {"distinct_ids": {"C1": 100_000}})
    assert unknown.full_rows == 100_000 and unknown.bytes_per_row == full.bytes_per_row
    assert "every row planned full" in unknown.lines()[0]


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


def _store_with_a_checkpoint_in(tmp_path, shard_num: int) -> CheckpointStore:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    ckpt_id = make_id(1, 10)
    (tmp_path / "staged").mkdir()
    (tmp_path / "staged" / "x.txt").write_text("x")
    store.commit(ckpt_id, store.upload_dir(tmp_path / "staged", ckpt_id), {"table": {"shard_num": shard_num}})
    return store


def test_job_spec_carries_the_resolved_shard_num(tmp_path):
    cfg = _cfg(ps={"servers": 3}, checkpoint={"uri": str(tmp_path / "ckpt")})
    assert prepare_job(cfg, None).spec("d", "w", "s").plan.shard_num == 24
    assert planner.job_plan(cfg, restore=_restored(16)).shard_num == 16


def test_the_job_corrects_for_the_negative_sample_rate_its_data_was_prepared_with(tmp_path):
    cfg = _cfg(checkpoint={"uri": str(tmp_path / "ckpt")})  # a config that does not say the data was sampled
    job = prepare_job(cfg, {"negative_sample_rate": 0.25})
    assert job.spec("d", "w", "s").plan.negative_sample_rate == 0.25
    assert prepare_job(cfg, None).plan.negative_sample_rate == 1.0  # no stats: the config's


def test_the_plan_travels_beside_the_users_config_which_stays_as_written(tmp_path):
    """A config that leaves the shard count to the planner (24 on 3 servers) and says 0.5, a restore of a table saved
    in 12 shards, data prepared at 0.25: the roles get the config as the user wrote it and the plan as the job
    resolved it."""
    from components.ps.contract import JobSpec

    _store_with_a_checkpoint_in(tmp_path, 12)
    cfg = _cfg(checkpoint={"uri": str(tmp_path / "ckpt"), "resume": "latest"}, ps={"servers": 3},
               data={"negative_sample_rate": 0.5})
    job = prepare_job(cfg, {"negative_sample_rate": 0.25, "distinct_ids": {"C1": 1000}})
    spec = JobSpec.from_json(job.spec("d", "w", "s").to_json())  # as a role reads it
    assert spec.config == to_dict(cfg) and job.cfg is cfg
    assert spec.config["table"]["shard_num"] is None and spec.config["data"]["negative_sample_rate"] == 0.5
    assert (spec.plan.shard_num, spec.plan.negative_sample_rate) == (12, 0.25)
    assert spec.plan.shard_source == f"as saved in checkpoint {job.restore.id}"
    assert spec.plan == job.plan and spec.plan.memory.rows == 1000 and spec.plan.memory.shard_num == 12


def test_the_restore_target_carries_the_saved_shard_count(tmp_path):
    store = _store_with_a_checkpoint_in(tmp_path, 12)
    restore = restore_target(store, "latest", None)
    assert restore.shard_num == 12
    with pytest.raises(ConfigError, match="table.shard_num"):
        planner.job_plan(_cfg(table={"shard_num": 16}), restore=restore)


def test_train_step_reports_the_load_and_records_it(tmp_path):
    plan = _plan(_cfg())
    checkpoint = {"id": "c1", "epoch": 1, "uri": "u", "servers": {"rows": [100, 120], "saved_bytes": [1000, 1200]}}
    memory = [{"serving_rss": GIB // 4, "peak_rss": GIB // 2}, {"serving_rss": GIB // 4, "peak_rss": GIB // 2}]
    result = JobResult(epochs=[{"epoch": 1, "examples": 10, "seconds": 1.0, "auc": 0.7}], seconds=2.0,
                       checkpoints=[checkpoint], restored_from=None, plan=plan, server_memory=memory)
    lines = server_report(result)
    assert "rows 100 | 120 (largest 1.091x the mean)" in lines[0]
    assert "saved shards 0.0 MiB | 0.0 MiB" in lines[1] and "peak 512.0 MiB | 512.0 MiB" in lines[2]
    summary = training_summary(result, CheckpointStore(str(tmp_path / "u")))
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


# -- every process ---------------------------------------------------------------------------------------------
def _job_plan(cfg, stats=None):
    """Every process's plan as plan=true makes it: the shard count resolved, the data's shape from stats or config."""
    return process_plan.plan_processes(cfg, process_plan.data_shape(cfg, stats), planner.job_plan(cfg, stats),
                                       planner.distinct_train_ids(stats))


def test_the_data_shape_from_the_config_is_the_prepared_datasets(tmp_path):
    """Synthetic splits planned from data.rows are the ones data prep writes, and a row read into memory takes
    exactly row_bytes (read_shards' arrays) and tokens_per_row tokens of text."""
    cfg = _cfg(data={"rows": 1003, "valid_fraction": 0.1, "shards_per_worker": 2}, ps={"workers": 2})
    stats = prepare_synthetic(tmp_path / "data", rows=1003, test_fraction=cfg.data.test_fraction, num_shards=4,
                              vocab_size=cfg.table.vocab_size, seed=0, valid_fraction=0.1)
    planned, prepared = process_plan.data_shape(cfg), process_plan.data_shape(cfg, stats)
    assert planned.rows == prepared.rows and planned.shard_rows == prepared.shard_rows
    assert (planned.dense_dim, planned.sparse_slots) == (prepared.dense_dim, prepared.sparse_slots) == (13, 26)
    schema = Schema.from_dict(stats["schema"])
    paths = [tmp_path / "data" / rel for rel in stats["shards"]["test"]]
    labels, dense, sparse = read_shards(paths, schema)
    held = labels.nbytes + dense.nbytes + sum(slot.values.nbytes + slot.offsets.nbytes for slot in sparse)
    assert held == len(labels) * planned.row_bytes + 8 * len(sparse)  # one offset more than rows a slot
    first = paths[0].read_text().splitlines()[0]
    assert len(first.split()) == planned.tokens_per_row
    assert prepared.share("test", 1, 2) == (sum(stats["shard_rows"]["test"][1::2]),
                                            max(stats["shard_rows"]["test"][1::2]))
    files = process_plan.data_shape(_cfg(data={"source": "files", "uri": "s3://b/x", "format": "raw"}))
    assert not files.known and "counted by data prep" in files.source


def test_a_geo_worker_grows_with_the_vocabulary_and_an_async_one_does_not():
    small, large = ({"vocab_size": 1 << 20}, {"vocab_size": 1 << 22})
    geo = [_job_plan(_cfg(ps={"mode": "geo"}, table=t)).process("worker").bytes for t in (small, large)]
    assert geo[1] - geo[0] == process_plan.GEO_TABLE_COPIES * ((1 << 22) - (1 << 20)) * 9 * planner.FLOAT_BYTES
    plain = [_job_plan(_cfg(table=t)).process("worker").bytes for t in (small, large)]
    assert plain[0] == plain[1]
    plan = _job_plan(_cfg(ps={"mode": "geo"}))
    assert plan.memory is None and [p.kind for p in plan.processes] == ["worker", "baseline", "evaluate", "export",
                                                                        "serving"]
    assert "not planned in geo mode" in plan.lines()[0]


def test_a_worker_holds_its_largest_share_of_a_scored_split():
    cfg = _cfg(data={"rows": 100_000, "valid_fraction": 0.1, "test_fraction": 0.2}, ps={"workers": 2})
    worker = _job_plan(cfg).process("worker")
    shape = process_plan.data_shape(cfg)
    rows, largest = 10_000, 10_000  # 20,000 test rows in 2 shard files: one each
    parts = {part.what.split(" (")[0]: part.bytes for part in worker.parts}
    assert parts["base"] == process_plan.WORKER_PROCESS_BYTES
    assert parts["its share of the test split"] == rows * shape.row_bytes
    assert parts["reading it"] == largest * shape.tokens_per_row * process_plan.READ_PARSE_BYTES_PER_TOKEN
    assert parts["the test split's score counts, merged by worker 0"] == 20_000 * process_plan.SCORE_COUNT_BYTES
    assert worker.bytes == sum(parts.values()) and worker.count == 2
    more = _job_plan(_cfg(data={"rows": 100_000, "valid_fraction": 0.1, "test_fraction": 0.2, "shards_per_worker": 4},
                          ps={"workers": 2})).process("worker")
    assert more.bytes < worker.bytes  # smaller shard files: less to parse at once


def test_the_export_plan_follows_the_largest_shard_or_the_whole_table():
    cfg = _cfg(table={"vocab_size": 10_000_000, "shard_num": 7, "embedding_dim": 9})
    export = _job_plan(cfg).process("export")
    fixed = process_plan.EXPORT_PROCESS_BYTES + process_plan.EXPORT_FIXED_BYTES
    # The largest shard parsed, and the one before it, written while it is read.
    assert export.bytes == fixed + math.ceil(10_000_000 / 7) * (8 + 4 * 9) * (process_plan.EXPORT_PARSE_FACTOR + 1)
    assert "10,000,000 rows / shard_num 7 = 1,428,572 rows" in export.line()
    single = _job_plan(dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, format=ExportFormat.single)))
    assert single.process("export").bytes == fixed + 10_000_000 * 44 * process_plan.EXPORT_PARSE_FACTOR
    assert single.process("serving").bytes - _job_plan(cfg).process("serving").bytes == 10_000_000 * 44
    # The distinct train ids bound the rows tighter than vocab_size.
    stats = {"distinct_ids": {"C1": 70_000}}
    assert _job_plan(cfg, stats).process("export").bytes == fixed + 10_000 * 44 * (process_plan.EXPORT_PARSE_FACTOR + 1)


def test_the_baseline_plan_is_bounded_by_its_settings_and_the_evaluate_plan_by_the_rows_it_reads():
    cfg = _cfg(data={"rows": 100_000}, eval={"baseline_rows": 30_000, "baseline_features": 1 << 20})
    plan = _job_plan(cfg).process("baseline")
    shape = process_plan.data_shape(cfg)
    # 70,000 train rows in 2 shard files of 35,000: the baseline reads the first whole file for its 30,000 rows.
    assert process_plan.first_rows(shape, "train", 30_000) == (35_000, 35_000)
    assert process_plan.first_rows(shape, "train", 40_000) == (70_000, 35_000)
    parts = {part.what.split(" (")[0]: part.bytes for part in plan.parts}
    assert parts["the weights and the buckets reached"] == (1 << 20) * process_plan.BUCKET_BYTES
    assert parts["its train rows, whole shard files"] == 35_000 * shape.row_bytes
    entries = shape.ids_per_example + shape.dense_dim
    assert parts["the design"] == 30_000 * (entries * process_plan.DESIGN_BYTES_PER_ENTRY + process_plan.FITTED_ROW_BYTES)
    # The buckets reached: at most one per train id of the fitted rows, fewer than the 2^20 buckets here.
    assert parts["the solver"] == 30_000 * shape.ids_per_example * process_plan.REACHED_BUCKET_BYTES
    assert plan.bytes == sum(parts.values())
    # Neither the table nor its dim moves it, but for the buckets a small table can reach.
    wide = _cfg(data={"rows": 100_000}, eval={"baseline_rows": 30_000, "baseline_features": 1 << 20},
                table={"vocab_size": 1 << 30, "embedding_dim": 33})
    assert _job_plan(wide).process("baseline").bytes == plan.bytes
    narrow = _cfg(data={"rows": 100_000}, eval={"baseline_rows": 30_000, "baseline_features": 1 << 20},
                  table={"vocab_size": 1000})
    assert _job_plan(narrow).process("baseline").bytes == plan.bytes - parts["the solver"] + 1000 * 110

    evaluate = {part.what.split(" (")[0]: part.bytes for part in _job_plan(cfg).process("evaluate").parts}
    assert evaluate["the train rows the servers' load is counted on"] == 70_000 * shape.row_bytes
    assert evaluate["the test split"] == 20_000 * shape.row_bytes
    assert evaluate["the baseline's weights"] == (1 << 20) * 8
    off = _job_plan(_cfg(data={"rows": 100_000}, eval={"baseline": False}, model={"blend_baseline": False}))
    assert "baseline" not in {p.kind for p in off.processes}
    parts = {part.what.split(" (")[0]: part.bytes for part in off.process("evaluate").parts}
    assert set(parts) == {"base", "the test split's score counts, raw and calibrated",
                          "the train rows the servers' load is counted on", "reading it"}


def test_step_memory_is_the_larger_of_the_config_and_the_plan():
    cfg = _cfg()
    assert process_plan.step_memories(cfg) == {"baseline": ("8Gi", "cluster.steps.baseline.memory"),
                                               "evaluate": ("8Gi", "cluster.steps.evaluate.memory"),
                                               "export": ("4Gi", "cluster.steps.export.memory")}
    big = _cfg(table={"vocab_size": 1 << 28}, export={"format": "single"})
    plan = process_plan.compile_time_plan(big).process("export")
    quantity, source = process_plan.step_memories(big)["export"]
    assert quantity == f"{math.ceil(plan.bytes * process_plan.PLAN_MARGIN / GIB)}Gi" and "export plan" in source
    assert planner.kubernetes_bytes(quantity) >= plan.bytes * process_plan.PLAN_MARGIN
    assert process_plan.request_quantity(300 * planner.MIB) == "300Mi" and process_plan.request_quantity(GIB + 1) == "2Gi"


def test_the_job_plan_has_a_line_per_process():
    plan = _job_plan(_cfg(ps={"servers": 3}))
    lines = plan.lines()
    assert [line.split(":")[1].split()[0] for line in lines] == ["server", "worker", "baseline", "evaluate", "export",
                                                                  "serving"]
    assert plan.process("server").bytes == plan.memory.server_bytes and " x3: " in lines[0]
    assert set(plan.summary()) == {"server", "worker", "baseline", "evaluate", "export", "serving"}
    unknown = _job_plan(_cfg(data={"source": "files", "uri": "s3://b/x"}))
    assert "split rows counted by data prep" in unknown.lines()[-1]


# -- sizing --------------------------------------------------------------------------------------------------
def test_mean_digits_and_the_saved_line():
    assert sizing.mean_digits(10) == 1 and sizing.mean_digits(100) == 1.9 and sizing.mean_digits(1000) == 2.89
    # The measured dim 9 adagrad lines (ids below 2^20): 138.4 B.
    assert sizing.saved_line_bytes(_cfg().table, 1 << 20) == pytest.approx(138.4, abs=0.3)
    wider = _cfg(table={"embedding_dim": 17}).table  # 8 more weights, the same two g2sum floats
    assert sizing.saved_line_bytes(wider, 1 << 20) - sizing.saved_line_bytes(_cfg().table, 1 << 20) == \
        pytest.approx(8 * (sizing.SAVED_WEIGHT_CHARS + 1))


def test_the_sizing_table_follows_from_its_inputs():
    inputs = sizing.SizingInputs(rows_per_s=250_000, ids=(10 ** 9, 10 ** 10), server_gib=(256, 512))
    table = _cfg().table
    per_row, base = planner.bytes_per_row(table), planner.server_base_bytes(table)
    for row in sizing.sizing_table(inputs):
        assert row.table_bytes == row.ids * per_row
        for gib, servers in row.servers.items():
            # The fewest servers whose fullest (ceil(ids / servers) rows) fits, as the planner would check it.
            assert math.ceil(row.ids / servers) * per_row + base <= gib * GIB
            assert servers == 1 or math.ceil(row.ids / (servers - 1)) * per_row + base > gib * GIB
            assert row.save_seconds[gib] == math.ceil(row.ids / servers) / 250_000
        assert row.checkpoint_bytes == round(row.ids * sizing.saved_line_bytes(table, row.ids))
        assert row.pull_bytes == 256 * 26 * (8 + 4 * 9) and row.push_bytes == 256 * 26 * (8 + 4 * 12)
        assert row.geo_worker_bytes == process_plan.GEO_TABLE_COPIES * row.ids * 9 * 4
    rows = sizing.sizing_table(inputs)
    assert rows[1].servers[256] == 6 and rows[1].servers[512] == 3  # 1.36 TiB of rows
    text = sizing.sizing_markdown(inputs)
    assert "| 10,000,000,000 | 149 |" in text and "its rows at 250,000 rows/s" in text
    assert sizing.servers_needed(10, table, base) is None  # no room beside the base


def test_the_sizing_script_prints_the_table(capsys):
    from bench.sizing import main

    text = main(["250000", "--ids", "1e9", "--server-gib", "512"])
    assert text == sizing.sizing_markdown(sizing.SizingInputs(rows_per_s=250_000, ids=(10 ** 9,), server_gib=(512,)))
    assert capsys.readouterr().out == text and "servers at 512 GiB" in text
