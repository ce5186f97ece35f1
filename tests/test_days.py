"""Day names, their order, the checkpoint store's ledger of trained days, and the one-line errors before any work."""

import dataclasses
import json

import numpy as np
import pytest

from components.checkpoint.days import DayLedger, DayOrderError
from components.checkpoint.store import CheckpointStore
from components.config import ConfigError, from_dict
from components.config_rules import validate
from components.data_prep.input_checks import check_inputs
from components.data_prep.distinct import DistinctCounter
from components.days import DayError, day_uri, expand_days, scheduled_day
from components.resolve.step import check_checkpoint_store
from pipelines.days import day_config, plan_days
from tests.conftest import commit_staged_checkpoint, compose_config


def test_day_names_ranges_and_order():
    assert expand_days([0, "1", "2..3"]) == ["0", "1", "2", "3"]
    assert expand_days(["2026-11-30..2026-12-02"]) == ["2026-11-30", "2026-12-01", "2026-12-02"]
    assert expand_days(["dt=20261130..dt=20261201", "dt=20261202"]) == ["dt=20261130", "dt=20261201", "dt=20261202"]
    assert expand_days(["8", "9", "10"]) == ["8", "9", "10"]  # numbers by value, not as text
    assert expand_days(["007..009"]) == ["007", "008", "009"]
    for days, named in ((["3", "2"], "'2'"), (["1", "1"], "'1'"), (["2026-11-05..2026-11-01"], "2026-11-05"),
                        (["2026-11-01..20261105"], "2026-11-01")):
        with pytest.raises(DayError, match=named):
            expand_days(days)
    assert day_uri("s3://logs/dt={day}/*.tsv", "20261101") == "s3://logs/dt=20261101/*.tsv"
    assert scheduled_day("2026-12-01T02:00:00Z", "%Y%m%d", 1) == "20261130"


@pytest.fixture
def day_files(tmp_path):
    for day in (0, 1):
        (tmp_path / f"day_{day}.tsv").write_text("0\t" + "\t" * 38 + "\n")
    (tmp_path / "day_2.tsv").write_text("")
    return tmp_path


def _daily(tmp_path, day_files, *overrides):
    return compose_config(tmp_path / "run", "data=criteo", f"data.uri='{day_files}/day_{{day}}.tsv'", *overrides)


@pytest.mark.parametrize("days, message", [
    ("[0,1,3]", "day '3': nothing matches it"),
    ("[0,1,2]", "day '2': every file it names is empty"),
    ("[1,0]", "day '0' comes after '1'"),
])
def test_a_missing_empty_or_out_of_order_day_is_one_line_before_anything(tmp_path, day_files, days, message):
    cfg = _daily(tmp_path, day_files, f"data.days={days}")
    with pytest.raises(ConfigError, match=message) as err:
        validate(cfg)
        check_inputs(cfg)
    assert "\n" not in str(err.value) and "data.days" in str(err.value)


def test_day_partitions_need_each_other_and_a_restorable_table(tmp_path, day_files):
    with pytest.raises(ConfigError, match="holds a \\{day\\} placeholder"):
        validate(_daily(tmp_path, day_files))  # a {day} URI without data.days
    with pytest.raises(ConfigError, match="data.uri"):
        validate(compose_config(tmp_path / "run", "data=criteo", f"data.uri={day_files}/day_0.tsv", "data.days=[0]"))
    with pytest.raises(ConfigError, match="checkpoint.resume"):
        validate(_daily(tmp_path, day_files, "data.days=[0,1]", "checkpoint.resume=latest"))
    with pytest.raises(ConfigError, match="geo"):
        validate(_daily(tmp_path, day_files, "data.days=[0,1]", "ps=geo"))
    validate(_daily(tmp_path, day_files, "data.days=[0,1]"))


def _record(ledger, day):
    ledger.record({"day": day, "checkpoint": f"ckpt-{day}"}, None, {"C1": DistinctCounter()})


def test_a_rerun_skips_trained_days_and_refuses_one_before_them(tmp_path, day_files):
    cfg = _daily(tmp_path, day_files, "data.days=[0,1]", f"checkpoint.uri={tmp_path / 'store'}")
    ledger = DayLedger(CheckpointStore(cfg.checkpoint.uri))
    assert plan_days(cfg) == ([], ["0", "1"])
    _record(ledger, "0")
    assert plan_days(cfg) == (["0"], ["1"])
    assert ledger.check_next("0")["checkpoint"] == "ckpt-0" and ledger.check_next("1") is None
    _record(ledger, "1")
    assert plan_days(cfg) == (["0", "1"], [])
    with pytest.raises(DayOrderError, match="day '0b' comes before day '1'"):
        ledger.plan(["0", "0b", "1"])  # an untrained day between trained ones
    late = _daily(tmp_path, day_files, "data.days=[0]", f"checkpoint.uri={tmp_path / 'late'}")
    _record(DayLedger(CheckpointStore(late.checkpoint.uri)), "1")
    with pytest.raises(ConfigError, match="day '0' comes before day '1', which .* has trained already"):
        plan_days(late)
    typed = from_dict(cfg)
    assert day_config(typed, "[0-2]").run_dir.endswith("/days/_0-2_") and day_config(typed, "1").data.day == "1"


def test_the_ledger_keeps_the_union_of_the_days_ids(tmp_path):
    ledger = DayLedger(CheckpointStore(str(tmp_path / "store")))
    assert ledger.seen_ids() is None
    first, second = DistinctCounter(), DistinctCounter()
    first.add(np.arange(10, dtype="uint64"))
    second.add(np.arange(5, 20, dtype="uint64"))
    ledger.record({"day": "0", "checkpoint": "a"}, {"rows": 1}, {"C1": first})
    ledger.record({"day": "1", "checkpoint": "b"}, {"rows": 2}, {"C1": second})
    assert ledger.seen_ids()["C1"].count() == 20
    ledger.record({"day": "1", "checkpoint": "c"}, {"rows": 3}, {"C1": second})  # a day recorded again
    assert ledger.trained() == ["0", "1"] and ledger.last()["checkpoint"] == "c"
    assert ledger.seen_ids()["C1"].count() == 20 and ledger.entry("0")["drift"] == {"rows": 1}


def test_resuming_a_checkpoint_that_finished_its_passes_says_so_before_any_work(tmp_path):
    """checkpoint.resume=latest on a store whose checkpoint trained ps.epochs passes: one line naming the checkpoint
    and what to raise, from the check every run starts with (not a traceback from the train step)."""
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "state.json").write_text(json.dumps({"epoch": 2, "chunk": 0, "history": []}))
    committed = commit_staged_checkpoint(staged, {"rows": 0})
    cfg = from_dict(compose_config(tmp_path / "run", f"checkpoint.uri={committed.parent}",
                                   "checkpoint.resume=latest", "ps.epochs=2"))
    with pytest.raises(ConfigError, match=f"more than the 2 passes checkpoint {committed.name} has trained already"
                                          ".*ps.epochs=3 trains one more pass") as err:
        check_checkpoint_store(cfg)
    assert "\n" not in str(err.value)
    check_checkpoint_store(dataclasses.replace(cfg, ps=dataclasses.replace(cfg.ps, epochs=3)))
