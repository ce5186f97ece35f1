"""Drift between days: new-id fractions, the day's summary, its comparison with the day before, and the merge step
that refuses a broken day against a real checkpoint store's ledger."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from components.checkpoint.days import ledger_at
from components.checkpoint.days import DayLedger
from components.checkpoint.store import CheckpointStore
from components.config import DriftConfig
from components.data_prep.distinct import DistinctCounter
from components.data_prep.drift import compare, day_summary, new_id_fractions
from components.data_prep.prepare import DataPrepError, prepare_files, read_distinct_ids
from components.data_prep.step import convert_units, merge_parts, plan_dataset, prepare_dataset


def _counter(ids) -> DistinctCounter:
    counter = DistinctCounter()
    counter.add(np.asarray(list(ids), np.uint64))
    return counter


def test_new_id_fractions_are_exact_on_small_sets():
    today = {"a": _counter([1, 2, 3, 4]), "b": _counter([7, 8]), "c": _counter([5])}
    seen = {"a": _counter([3, 4, 5]), "c": _counter([5, 6])}
    overall, per_slot = new_id_fractions(today, seen)
    assert per_slot == {"a": 0.5, "b": 1.0, "c": 0.0}  # b: a slot no earlier day had
    assert overall == 4 / 7
    assert new_id_fractions(today, None) == (None, {})  # the first day
    assert today["a"].count() == 4 and seen["a"].count() == 3  # the counters are left as they were


def test_new_id_fractions_of_sketches_are_within_a_few_percent():
    rng = np.random.default_rng(1)
    ids = rng.permutation(np.arange(1, 250_001, dtype=np.uint64) * np.uint64(2654435761))
    today, seen = _counter(ids[:150_000]), _counter(ids[100_000:250_000])  # 50_000 shared
    assert not today.is_exact and not seen.is_exact
    overall, per_slot = new_id_fractions({"a": today}, {"a": seen})
    assert per_slot["a"] == pytest.approx(100_000 / 150_000, abs=0.03) and overall == per_slot["a"]
    _, none_new = new_id_fractions({"a": today}, {"a": today})
    assert none_new["a"] == 0.0  # clipped at 0 whatever the estimates


def _summary(day: str, *, rows: int = 1000, ctr: float = 0.1, missing=None, new=None) -> dict:
    """A day's summary as day_summary writes it (the input compare takes)."""
    new = new or {}
    return {"day": day, "rows": rows, "ctr": ctr, "missing": missing or {"C1": 0.0, "C2": 0.1},
            "new_id_fraction": (sum(new.values()) / len(new)) if new else None, "new_id_fractions": new}


def test_compare_warns_of_days_that_moved_more_than_the_limits():
    drift = DriftConfig()
    before = _summary("1", new={"C1": 0.3, "C2": 0.1})
    quiet = compare(_summary("2", rows=1200, ctr=0.11, new={"C1": 0.35, "C2": 0.1}), before, drift)
    assert quiet == {"warnings": [], "errors": []}
    moved = compare(_summary("2", rows=2000, ctr=0.05, missing={"C1": 0.0, "C2": 0.5}, new={"C1": 0.9, "C2": 0.1}),
                    before, drift)
    assert moved["errors"] == []
    assert moved["warnings"] == [
        "day '2': 2000 rows, +100.0% from 1000 on day '1' (data.drift.max_rows_change=0.5)",
        "day '2': CTR 0.0500, -50.0% from 0.1000 on day '1' (data.drift.max_ctr_change=0.25)",
        "day '2': slot C1: 90.0% of its train ids are new (30.0% on day '1'; data.drift.max_new_id_change=0.2)",
        "day '2': slot C2 is missing in 50.0% of rows (10.0% on day '1'; data.drift.max_missing_change=0.2)",
    ]
    lenient = DriftConfig(max_rows_change=2.0, max_ctr_change=0.6, max_new_id_change=0.7, max_missing_change=0.5)
    assert compare(_summary("2", rows=2000, ctr=0.05, missing={"C1": 0.0, "C2": 0.5}, new={"C1": 0.9}), before,
                   lenient)["warnings"] == []
    # The second day has new-id fractions, the first none: nothing to compare them with.
    assert compare(_summary("2", new={"C1": 0.9}), _summary("1"), drift)["warnings"] == []


def test_compare_stops_a_day_without_clicks_or_with_a_slot_that_stopped_arriving():
    drift = DriftConfig()
    no_clicks = compare(_summary("1", ctr=0.0), None, drift)  # the first day too
    assert no_clicks == {"warnings": [], "errors": [
        "day '1' has no clicks in its 1000 rows; a broken log pipeline? set data.drift.allow_no_clicks=true to "
        "train anyway"]}
    gone = compare(_summary("3", missing={"C1": 0.0, "C2": 1.0}), _summary("2"), drift)
    assert gone == {"warnings": [], "errors": [
        "day '3': slot C2 is missing in every row (10.0% missing on day '2'); a broken log pipeline? set "
        "data.drift.allow_missing_slot=true to train anyway"]}
    always_gone = _summary("2", missing={"C1": 0.0, "C2": 1.0})
    assert compare(_summary("3", missing={"C1": 0.0, "C2": 1.0}), always_gone, drift)["errors"] == []
    allowed = compare(_summary("3", ctr=0.0, missing={"C1": 0.0, "C2": 1.0}), _summary("2"),
                      DriftConfig(allow_no_clicks=True, allow_missing_slot=True))
    assert allowed == {"errors": [], "warnings": [
        "day '3' has no clicks in its 1000 rows (data.drift.allow_no_clicks=true: training anyway)",
        "day '3': slot C2 is missing in every row (10.0% missing on day '2') (data.drift.allow_missing_slot=true: "
        "training anyway)"]}


def _raw(index: int, *, click: int, c7: str | None = None) -> str:
    values = [f"{index:08x}", *(f"v{n}-{index % 5}" for n in range(2, 27))]
    if c7 is not None:
        values[6] = c7
    return "\t".join([str(click), *[str(index % 30)] * 13, *values]) + "\n"


def test_day_summary_holds_the_days_rows_ctr_missing_values_and_new_ids(tmp_path):
    (tmp_path / "day.tsv").write_text("".join(_raw(i, click=int(i % 4 == 0), c7="" if i % 2 else None)
                                              for i in range(200)))
    stats = prepare_files(tmp_path / "out", uri=str(tmp_path / "day.tsv"), fmt="raw", test_fraction=0.2,
                          valid_fraction=0.1, num_shards=1, vocab_size=1 << 40, seed=0, max_malformed_fraction=0.0)
    counters = read_distinct_ids(tmp_path / "out")
    seen = {"C1": counters["C1"].copy()}  # every C1 id of today's train split was seen; the other slots' not
    summary = day_summary({**stats, "day": "5"}, counters, seen)
    assert summary["rows"] == 200 and summary["ctr"] == 50 / 200
    assert summary["missing"]["C7"] == 0.5 and summary["day"] == "5"
    assert summary["new_id_fractions"]["C1"] == 0.0 and summary["new_id_fractions"]["C2"] == 1.0
    assert json.loads(json.dumps(summary)) == summary  # the ledger stores it as JSON


class _Days:
    """Day partitions of raw TSV prepared by the pipeline's own steps (plan, convert, merge) against a local
    checkpoint store."""

    def __init__(self, root: Path):
        self.root = root
        (root / "in").mkdir()
        self.store_uri = str(root / "checkpoint")

    def write(self, day: str, lines: list[str]) -> None:
        (self.root / "in" / f"day_{day}.tsv").write_text("".join(lines))

    def config(self, day: str, **drift) -> dict:
        return {"data": {"source": "files", "uri": f"{self.root}/in/day_{{day}}.tsv", "days": ["1", "2", "3"],
                         "day": day, "split": "ordered", "prep_processes": 1, "drift": drift},
                "ps": {"workers": 1}, "checkpoint": {"uri": self.store_uri}}

    def out(self, day: str) -> Path:
        return self.root / f"dataset-{day}"

    def merge(self, day: str, **drift) -> dict:
        config = self.config(day, **drift)
        groups = plan_dataset(config)
        parts = [tempfile.mkdtemp(prefix=f"parts-{day}-", dir=self.root) for _ in groups]
        for group, directory in zip(groups, parts):
            convert_units(group, directory)
        return merge_parts(groups, parts, str(self.out(day)), ledger_at)

    def stats(self, day: str) -> dict:
        return json.loads((self.out(day) / "stats.json").read_text())

    def record(self, day: str) -> None:
        """What the train step records of a trained day."""
        ledger = DayLedger(CheckpointStore(self.store_uri))
        ledger.record({"day": day}, self.stats(day)["drift"]["summary"], read_distinct_ids(self.out(day)))


def test_the_merge_step_compares_a_day_with_the_last_trained_one_and_refuses_a_broken_day(tmp_path, capsys):
    days = _Days(tmp_path)
    days.write("1", [_raw(i, click=int(i % 3 == 0)) for i in range(300)])
    days.write("2", [_raw(i, click=0) for i in range(150, 450)])
    days.write("3", [_raw(i, click=int(i % 3 == 0), c7="") for i in range(200, 500)])

    first = days.merge("1")
    drift = days.stats("1")["drift"]
    assert first["day"] == "1" and "drift_warnings" not in first
    assert drift["previous_day"] is None and drift["warnings"] == [] and drift["errors"] == []
    assert drift["summary"]["day"] == "1" and drift["summary"]["new_id_fraction"] is None
    assert drift["summary"]["rows"] == 300 and drift["summary"]["ctr"] == 100 / 300
    days.record("1")

    with pytest.raises(DataPrepError, match=r"^day '2' has no clicks in its 300 rows; a broken log pipeline\? set "
                                            r"data.drift.allow_no_clicks=true to train anyway$"):
        days.merge("2")
    assert not days.out("2").exists() and not list(tmp_path.glob(".dataset-2*"))  # nothing half-written

    allowed = days.merge("2", allow_no_clicks=True)
    assert "warning: day '2' has no clicks in its 300 rows" in capsys.readouterr().out
    stats = days.stats("2")
    assert stats["drift"]["previous_day"] == "1" and allowed["drift_warnings"] == stats["drift"]["warnings"]
    # C1 names the row: the ids of day 2's train rows that day 1's train rows did not hold are new.
    today, before = read_distinct_ids(days.out("2"))["C1"].exact, read_distinct_ids(days.out("1"))["C1"].exact
    expected = len(np.setdiff1d(today, before)) / len(today)
    assert 0 < expected < 1 and stats["drift"]["summary"]["new_id_fractions"]["C1"] == expected
    days.record("2")

    with pytest.raises(DataPrepError, match=r"^day '3': slot C7 is missing in every row \(0.0% missing on day "
                                            r"'2'\); a broken log pipeline\? set data.drift.allow_missing_slot=true"):
        days.merge("3")
    assert not days.out("3").exists()
    days.merge("3", allow_missing_slot=True)
    assert days.stats("3")["missing"]["C7"] == 1.0 and days.stats("3")["drift"]["errors"] == []


def test_a_run_without_day_partitions_has_no_drift(tmp_path):
    (tmp_path / "all.tsv").write_text("".join(_raw(i, click=0) for i in range(100)))  # no clicks: not checked
    config = {"data": {"source": "files", "uri": str(tmp_path / "all.tsv")}, "ps": {"workers": 1}}
    stats = prepare_dataset(config, str(tmp_path / "out"), ledger_at, processes=1)
    assert stats["drift"] is None and stats["day"] is None
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["drift"] is None
