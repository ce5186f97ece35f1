"""Fast checks of bench/ without starting a PS job: the hand-written reader and the report table."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from components.data_prep.multislot import Schema, read_shards
from components.data_prep.prepare import prepare_synthetic

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_handwritten_reader_matches_our_parser(tmp_path):
    hw = _load("handwritten_fleet")
    stats = prepare_synthetic(tmp_path / "d", rows=300, test_fraction=0.1, num_shards=2, vocab_size=1 << 20, seed=1)
    files = [str(tmp_path / "d" / p) for p in stats["shards"]["train"]]
    batches = list(hw.read_batches(files, 64))
    assert [len(b) for b in batches] == [64] * 4 + [270 - 256]
    rows = [row for batch in batches for row in batch]
    labels, dense, sparse = read_shards(files, Schema.from_dict(stats["schema"]))
    assert [r[0] for r in rows] == labels.tolist()
    np.testing.assert_allclose(np.array([r[1] for r in rows], np.float32), dense)
    for slot in range(hw.NUM_SLOTS):
        assert [v for r in rows for v in r[2][slot]] == sparse[slot].values.tolist()


def test_report_table_has_ratio_per_layout():
    tp = _load("throughput")
    row = dict(loop_s=10.0, examples=100_000, first_batch_s=7.0, wall_s=20.0, note="", polluted=False)
    results = [
        {**row, "layout": "1s/1w", "step": "ours", "ex_per_s": 10_000.0},
        {**row, "layout": "1s/1w", "step": "hand-written feed", "ex_per_s": 5_000.0},
        {**row, "layout": "1s/1w", "step": "hand-written dataset", "ex_per_s": 20_000.0, "polluted": True},
    ]
    table = tp.render(results, {"when": "now", "paddle": "2.6.2", "cpus": 2, "train_rows": 100_000, "quick": False})
    assert "**0.50** (vs hand-written dataset)" in table
    assert "hand-written dataset (*)" in table and table.count("\n| 1s/1w |") == 3


def test_memory_report_fits_the_slope_and_says_why_a_table_was_not_measured():
    mem = _load("memory")
    mib = 1 << 20

    def job(rows, growth):
        return {"rows": rows, "memory": [{"serving_rss": 288 * mib, "peak_rss": 288 * mib + g} for g in growth]}

    # 150 B/row on top of 30 MiB that every server grows by, whatever its rows.
    fit = mem.slope_fit(job([100_000, 100_000], [30 * mib + 15_000_000] * 2),
                        job([900_000, 700_000], [30 * mib + 135_000_000, 30 * mib + 105_000_000]))
    assert fit["slopes"] == [150.0, 150.0] and fit["intercept"] == 30 * mib and fit["serving"] == 288 * mib
    rows = [{"table": "MemorySparseTable", "dim": 9, "fit": fit, "small_rows": 100_000, "large_rows": 800_000,
             "planner": 154, "planner_fixed": 31 * mib},
            {"table": "SSDSparseTable", "dim": 9, "skipped": "not measured: RuntimeError: no"}]
    table = mem.render(rows, [{"servers": 3, "shard_num": 24, "rows": [100, 110, 90]}], {"when": "now", "cpus": 2})
    assert "| 150 (150 / 150) | 154 | **0.97** | 36 | 4.2 | 30 (31) | 288 (288) |" in table
    assert "not measured: RuntimeError: no" in table and "| 3 | 24 | 300 | 100 / 110 / 90 | **1.100** |" in table


def test_table_scale_report_names_the_processes_that_grew_with_the_table():
    ts = _load("table_scale")
    mib = 1 << 20
    run = dict(table_rows=1_000_000, server_rows=[500_000, 500_000], pass_s=60.0, train_step_s=100.0, save_s=10.0,
               save_rows_per_s=50_000.0, score_s=2.0, upload_s=1.0, evaluate_s=5.0, export_s=20.0,
               export_rows_per_s=25_000.0, restore_download_s=1.0, restore_load_s=5.0, auc_ratio=0.95,
               wall_s=400.0, outside_train_s=300.0, steps={"prep": 30.0, "train": 100.0, "evaluate": 20.0},
               fit_beside_s=None)
    small = {**run, "name": "small", "distinct_ids": 1_000_000,
             "peaks": {"server": 400 * mib, "worker": 600 * mib, "step export_model": 400 * mib}}
    large = {**run, "name": "large", "distinct_ids": 16_000_000, "train_step_s": 150.0, "fit_beside_s": 42.0,
             "peaks": {"server": 1600 * mib, "worker": 610 * mib, "step export_model": 700 * mib}}
    table = ts.render([small, large], 1_000_000)
    assert "| server | 400 | 1,600 | 4.00 |" in table and "| worker | 600 | 610 | 1.02 |" in table
    assert "above 1.5x their small-table peak: step export_model." in table  # the server may grow; others not
    assert "Train step / pass on the largest table: 2.50" in table
    assert "| small | 1,000,000 | 1,000,000 | 400.0 | 300.0 | 3.00 |" in table  # outside / train step
    # What the run spent outside its steps, and the baseline's fit beside the train step (a published one taken).
    assert "| small | 30.0 | 100.0 | 20.0 | 250.0 | (published already) |" in table
    assert "| large | 30.0 | 100.0 | 20.0 | 250.0 | 42.0 |" in table


def test_step_seconds_are_read_from_kfp_locals_task_log():
    ts = _load("table_scale")
    log = """09:32:01.139 - INFO - Executing task 'resolve-config'
09:32:01.639 - INFO - Task 'resolve-config' finished with status SUCCESS
09:59:59.500 - INFO - Executing task 'train'
    == baseline for the blend: fitted beside the job in 33.6s
10:00:42.750 - INFO - Task 'train' finished with status SUCCESS
10:00:43.000 - INFO - Executing task 'fit-baseline'
"""
    assert ts.step_seconds(log) == pytest.approx({"resolve-config": 0.5, "train": 43.25})
    assert ts._FIT_BESIDE.search(log).group(1) == "33.6"


def test_headroom_of_interactions_is_what_the_true_interaction_logit_adds_to_a_regression():
    hr = _load("headroom")
    quality = sys.modules["bench.quality"]
    cell = hr.headroom(quality.Generator("interactions", 20_000, 7, "check"))
    # The interactions generator's pairwise effects are as strong as its per-id ones: knowing them exactly is worth
    # far more than any lift target, and no more than the oracle (within the 2,000 test rows' noise).
    assert cell["regression"] + 0.03 < cell["with_interactions"] <= cell["oracle"] + 0.01
    # Crosses of the interacting fields learn a little of them from 16k train rows (16 fields: most pairs of
    # categories are seen a few times at most), the exact logit far more.
    assert cell["regression"] < cell["with_crosses"] < cell["with_interactions"] - 0.03
    table = hr.render([cell], "now")
    assert f"| interactions 20k | check | {cell['regression']:.4f} | {cell['with_interactions']:.4f} |" in table
    assert f"| {cell['with_crosses']:.4f} | {cell['with_crosses'] - cell['regression']:+.4f} |" in table


def test_crosses_have_one_column_per_pair_of_categories_that_occurs():
    hr = _load("headroom")
    categories = np.array([[0, 1, 2], [0, 1, 0], [1, 1, 2], [0, 1, 2]])
    matrix = hr.crosses(categories, (2, 2, 3), np.array([0, 2])).toarray()
    # One pair of fields (0, 2); its category pairs (0, 2), (0, 0), (1, 2): three columns, one 1 per row.
    assert matrix.shape == (4, 3) and (matrix.sum(axis=1) == 1).all()
    assert (matrix[0] == matrix[3]).all() and len({tuple(row) for row in matrix}) == 3


def test_network_table_shows_the_median_of_the_rounds_and_ratios_of_medians():
    net = _load("network")
    args = SimpleNamespace(rows=1000, repeats=3, links="none,100mbit")

    def run(link, job, seconds, received=2_000_000, sent=1_000_000, **extra):
        return dict(link=link, job=job, examples=1000, seconds=seconds, auc=0.75, received=received, sent=sent,
                    **extra)

    runs = [run("none", "async", s) for s in (1.0, 0.5, 2.0)]  # 1,000 / 2,000 / 500 examples/s
    runs += [run("100mbit", "async", s) for s in (2.0, 4.0, 1.0)]  # median 500
    runs += [run("100mbit", "sync", 2.0, received=1_000_000), dict(link="100mbit", job="sync", error="exited 1")]
    table = net.table(runs, args, ["none", "100mbit"], ["async", "sync"], netem=False, minutes=3)
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line for line in table.splitlines()[4:]}
    assert "| 1,000 (500-2,000) | 1.00x | 3,000 | 2,000 | 1,000 | 1.00x |" in rows["none", "async"]
    assert "| 500 (250-1,000) | 0.50x | 3,000 |" in rows["100mbit", "async"]
    assert "(1 of 2 failed: exited 1)" in rows["100mbit", "sync"] and "| 0.67x |" in rows["100mbit", "sync"]
    assert "| failed |" in rows["none", "sync"]
    assert "no sch_netem" in table


def test_peak_memory_counts_a_process_under_what_it_runs_after_exec():
    """A child seen before its exec (its parent's command line) is counted, once it execs, under its new kind."""
    import subprocess

    common = _load("common")
    grow = "x = bytearray(200 << 20); import time; time.sleep(1.5)"
    child = subprocess.Popen([sys.executable, "-c", "import os, sys, time; time.sleep(0.8); "
                              f"os.execv(sys.executable, [sys.executable, '-c', {grow!r}])"])
    kind = lambda pid: "before exec" if b"execv" in Path(f"/proc/{pid}/cmdline").read_bytes() else "grown"  # noqa: E731
    with common.PeakMemory(child.pid, kind_of=kind, period_s=0.05) as peaks:
        child.wait()
    assert peaks.peaks["grown"] >= 200 << 20 > peaks.peaks["before exec"]
