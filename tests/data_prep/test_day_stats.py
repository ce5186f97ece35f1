"""What day-by-day training needs of a dataset: an ordered split (validation and test rows from the end of the
input), the missing fraction of each slot, the train split's distinct-id counters, and the day's own input."""

from __future__ import annotations

import filecmp
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from components.config import from_dict
from components.data_prep.formats import raw_value_id
from components.data_prep.multislot import Schema, read_shards
from components.data_prep.prepare import (DISTINCT_IDS_FILE, DataPrepError, prepare_files, prepare_synthetic,
                                          read_distinct_ids)
from components.data_prep.step import data_plan

from tests.conftest import CRITEO, needs_criteo

VOCAB = 1 << 40  # every row's C1 value is its own index: at this size no two collide


def _raw(index: int, *, click: int = 0, categories: dict[int, str] | None = None) -> str:
    """A Criteo line whose C1 names the row; ``categories`` overrides C<n> (an empty string: missing)."""
    values = {1: f"{index:08x}", **{n: f"v{n}-{index % 7}" for n in range(2, 27)}, **(categories or {})}
    return "\t".join([str(click), *[str(index % 40)] * 13, *(values[n] for n in range(1, 27))]) + "\n"


def _lines(first: int, count: int) -> list[str]:
    # Lines of several lengths, so that byte positions and row counts differ.
    return [_raw(i, click=int(i % 3 == 0), categories={2: "x" * (i % 11)}) for i in range(first, first + count)]


def _write_ordered_inputs(root: Path) -> list[str]:
    """Two plain files around a gzip one (listed in name order); returns every line in input order."""
    root.mkdir()
    parts = [_lines(0, 900), _lines(900, 500), _lines(1400, 700)]
    (root / "part-a.tsv").write_text("".join(parts[0]))
    with gzip.open(root / "part-b.tsv.gz", "wt") as f:
        f.write("".join(parts[1]))
    (root / "part-c.tsv").write_text("".join(parts[2]))
    return [line for part in parts for line in part]


def _prepare(uri: str, out: Path, **settings) -> dict:
    defaults = dict(fmt="raw", test_fraction=0.2, valid_fraction=0.1, num_shards=2, vocab_size=VOCAB, seed=3,
                    max_malformed_fraction=0.0)
    return prepare_files(out, uri=uri, **{**defaults, **settings})


def _split_rows(out: Path, stats: dict, split: str) -> list[int]:
    """The input row index of every row of ``split`` (read back from its C1 id)."""
    _, _, sparse = read_shards([out / rel for rel in stats["shards"][split]], Schema.from_dict(stats["schema"]))
    index_of = {raw_value_id("C1", f"{i:08x}", VOCAB): i for i in range(2100)}
    return sorted(index_of[int(i)] for i in sparse[0].values)


def _files(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def test_an_ordered_split_takes_validation_and_test_rows_from_the_end_of_the_input(tmp_path):
    lines = _write_ordered_inputs(tmp_path / "in")
    one = _prepare(f"{tmp_path}/in/part-*", tmp_path / "one", split="ordered", processes=1, unit_bytes=16 << 10)
    two = _prepare(f"{tmp_path}/in/part-*", tmp_path / "two", split="ordered", processes=2, unit_bytes=16 << 10)
    assert one["prep"]["units"] >= 6 and one["split"] == "ordered"
    assert one == two and _files(tmp_path / "one") == _files(tmp_path / "two")
    for rel in _files(tmp_path / "one"):
        assert filecmp.cmp(tmp_path / "one" / rel, tmp_path / "two" / rel, shallow=False), rel

    train, valid, test = (_split_rows(tmp_path / "one", one, split) for split in ("train", "valid", "test"))
    assert sorted(train + valid + test) == list(range(len(lines)))
    assert max(train) < min(valid) and max(valid) < min(test)  # every test row comes after every train row
    # The cuts fall at byte positions over the whole input (the gzip file by its decompressed bytes).
    starts = np.concatenate([[0], np.cumsum([len(line) for line in lines])])
    total = starts[-1]
    assert starts[min(test)] >= 0.8 * total > starts[min(test) - 1]
    assert starts[min(valid)] >= 0.7 * total > starts[min(valid) - 1]


def test_the_random_split_stays_the_default_and_synthetic_data_is_split_by_position(tmp_path):
    _write_ordered_inputs(tmp_path / "in")
    stats = _prepare(f"{tmp_path}/in/part-*", tmp_path / "random")
    train, test = (_split_rows(tmp_path / "random", stats, split) for split in ("train", "test"))
    assert stats["split"] == "random" and max(train) > min(test)  # interleaved
    synthetic = prepare_synthetic(tmp_path / "synthetic", rows=2000, test_fraction=0.2, num_shards=1,
                                  vocab_size=1 << 20, seed=0)
    assert synthetic["split"] == "ordered" and synthetic["missing"] == {slot: 0.0 for slot in synthetic["missing"]}
    with pytest.raises(DataPrepError, match=r"unknown split 'sorted'"):
        _prepare(f"{tmp_path}/in/part-*", tmp_path / "bad", split="sorted")


def test_missing_values_are_counted_per_slot_over_every_split(tmp_path):
    rows = [_raw(i, click=i % 2, categories={3: "" if i < 4 else "c", 5: ""}) for i in range(10)]
    (tmp_path / "day.tsv").write_text("".join(rows[:5]) + "\n" + "1\tnot a row\n" + "".join(rows[5:]))
    stats = _prepare(str(tmp_path / "day.tsv"), tmp_path / "out", test_fraction=0.3, num_shards=1, split="ordered",
                     max_malformed_fraction=0.2)
    assert stats["malformed"]["count"] == 1 and sum(stats["rows"].values()) == 10  # the blank line is no row
    assert stats["missing"]["C3"] == 0.4 and stats["missing"]["C5"] == 1.0
    assert {slot for slot, fraction in stats["missing"].items() if fraction} == {"C3", "C5"}
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["missing"] == stats["missing"]


def test_missing_values_of_token_formats_are_the_slots_a_row_lacks(tmp_path):
    # Slot 3 in every fifth row only; slot 4 in none but the first.
    lines = [f"{i % 2}:1 {100 + i}:2" + (f" {200 + i}:3" if i % 5 == 0 else "") + (" 7:4" if i == 0 else "")
             for i in range(20)]
    (tmp_path / "feasign.txt").write_text("\n".join(lines) + "\n")
    stats = _prepare(str(tmp_path / "feasign.txt"), tmp_path / "out", fmt="feasign", num_shards=1, split="ordered")
    assert stats["missing"] == {"2": 0.0, "3": 0.8, "4": 0.95}


@needs_criteo
def test_missing_fractions_of_the_criteo_sample_are_its_empty_fields(tmp_path):
    sample = CRITEO / "raw_criteo_sample.tsv"
    stats = _prepare(str(sample), tmp_path / "out", test_fraction=0.3, valid_fraction=0.0, num_shards=1,
                     max_malformed_fraction=1.0)
    fields = [line.split("\t") for line in sample.read_text().splitlines() if line.strip()]
    good = [f for f in fields if len(f) == 40 and f[0] in ("0", "1")]
    assert len(good) == sum(stats["rows"].values())
    expected = {f"C{n}": sum(not f[13 + n] for f in good) / len(good) for n in range(1, 27)}
    assert stats["missing"] == pytest.approx(expected, abs=1e-12) and any(expected.values())


def test_the_dataset_holds_the_train_splits_distinct_id_counters(tmp_path):
    _write_ordered_inputs(tmp_path / "in")
    stats = _prepare(f"{tmp_path}/in/part-*", tmp_path / "out", split="ordered", unit_bytes=16 << 10, processes=1)
    assert (tmp_path / "out" / DISTINCT_IDS_FILE).is_file()
    counters = read_distinct_ids(tmp_path / "out")
    assert list(counters) == stats["schema"]["sparse_slots"]
    assert {slot: c.count() for slot, c in counters.items()} == stats["distinct_ids"]
    _, _, sparse = read_shards([tmp_path / "out" / rel for rel in stats["shards"]["train"]],
                               Schema.from_dict(stats["schema"]))
    for slot, ids in zip(stats["schema"]["sparse_slots"], sparse):
        assert counters[slot].is_exact and counters[slot].exact.tolist() == np.unique(ids.values).tolist(), slot


def test_a_daily_plan_reads_the_days_input_and_records_the_day(tmp_path):
    (tmp_path / "day_7.tsv").write_text("".join(_lines(0, 50)))
    config = {"data": {"source": "files", "uri": f"{tmp_path}/day_{{day}}.tsv", "days": ["7"], "day": "7",
                       "split": "ordered"}, "ps": {"workers": 1}}
    plan = data_plan(from_dict(config))
    assert plan.source == f"{tmp_path}/day_7.tsv" and plan.day == "7" and plan.split == "ordered"
    config["data"]["day"] = None
    with pytest.raises(DataPrepError, match=r"data.day names no day"):
        data_plan(from_dict(config))
