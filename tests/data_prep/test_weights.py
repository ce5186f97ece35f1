"""Row weights (data.weight_column): parsed in every format, written as the "weight" slot, read back; a row
without a usable weight refuses the input in one line naming the file, the line and the value."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from components.data_prep.formats import raw_value_id
from components.data_prep.multislot import Schema, format_line, parse_line, read_shards
from components.data_prep.prepare import DataPrepError, prepare_files

SPLITS = ("train", "valid", "test")
VOCAB = 1 << 40  # no two keys of a test share an id


def _raw_line(rng: random.Random, key: int, weight: str, extra: tuple[str, ...] = ()) -> str:
    """A raw row whose C1 is ``key`` (so its weight can be found again by its C1 id)."""
    dense = [str(rng.randint(0, 50)) for _ in range(13)]
    sparse = [f"{key:08x}", *(f"{rng.randint(0, 30):x}" for _ in range(25))]
    return "\t".join([str(int(rng.random() < 0.3)), *dense, *sparse, *extra, weight])


def _weight_of(key: int) -> float:
    return (key % 7) * 0.5  # 0 included: a row may weigh nothing


def _prepare(tmp_path: Path, text: str, fmt: str, weight_column: str, name: str = "in.txt", **settings) -> dict:
    (tmp_path / name).write_text(text)
    options = dict(uri=str(tmp_path / name), fmt=fmt, test_fraction=0.2, valid_fraction=0.1, num_shards=2,
                   vocab_size=VOCAB, seed=3, max_malformed_fraction=0.0, weight_column=weight_column)
    return prepare_files(tmp_path / "out", **{**options, **settings})


def _read(out: Path, stats: dict, split: str):
    return read_shards([out / p for p in stats["shards"][split]], Schema.from_dict(stats["schema"]), with_weights=True)


@pytest.mark.parametrize("weight_column,extra", [("40", ()), ("42", ("ignored", "too"))])
def test_raw_weights_round_trip_through_the_shards_and_the_reader(tmp_path, weight_column, extra):
    rng = random.Random(1)
    text = "".join(_raw_line(rng, key, f"{_weight_of(key):g}", extra) + "\n" for key in range(1500))
    stats = _prepare(tmp_path, text, "raw", weight_column)
    schema = Schema.from_dict(stats["schema"])
    assert schema.weighted and stats["schema"]["weighted"] is True and stats["weight_column"] == weight_column
    assert stats["slot_names"][:3] == ["click", "weight", "dense"] and schema.slot_dtypes()[1] == "float32"
    weight_by_id = {raw_value_id("C1", f"{key:08x}", VOCAB): _weight_of(key) for key in range(1500)}
    rows = 0
    for split in SPLITS:
        labels, dense, sparse, weights = _read(tmp_path / "out", stats, split)
        assert weights.dtype == np.float64 and len(weights) == len(labels) == stats["rows"][split]
        assert weights.tolist() == [weight_by_id[int(i)] for i in sparse[0].values]  # C1: one id per row
        rows += len(labels)
    assert rows == 1500
    shard = tmp_path / "out" / stats["shards"]["train"][0]
    lines = shard.read_text().splitlines()
    weights = read_shards([shard], schema, with_weights=True)[3]
    assert [parse_line(line, schema).weight for line in lines] == weights.tolist()
    assert all(line.split()[2] == "1" for line in lines)  # the weight slot holds one value, right after the label


def test_slot_and_feasign_weights_round_trip(tmp_path):
    rng = random.Random(2)
    slot_lines = ["click:1 " + " ".join(f"dense_feature:{rng.random():.3f}" for _ in range(13))
                  + f" weight:{_weight_of(key):g} 1:{key} " + " ".join(f"{n}:{rng.randint(0, 9)}" for n in range(2, 27))
                  for key in range(400)]
    stats = _prepare(tmp_path, "\n".join(slot_lines) + "\n", "slot", "weight")
    weight_by_id = {raw_value_id("C1", str(key), VOCAB): _weight_of(key) for key in range(400)}
    for split in SPLITS:
        _, _, sparse, weights = _read(tmp_path / "out", stats, split)
        assert weights.tolist() == [weight_by_id[int(i)] for i in sparse[0].values]
    # feasign: the weight token anywhere in the line; slots discovered without taking it for one.
    feasign_lines = [f"{key}:2 w:{_weight_of(key):g} {rng.randint(0, 1)}:1 {rng.randint(0, 9)}:3 {key}:2"
                     for key in range(400)]
    stats = _prepare(tmp_path, "\n".join(feasign_lines), "feasign", "w", name="feasign.txt")
    assert stats["schema"] == {"dense_dim": 0, "sparse_slots": ["2", "3"], "weighted": True}
    weight_by_id = {raw_value_id("2", str(key), VOCAB): _weight_of(key) for key in range(400)}
    for split in SPLITS:
        _, _, sparse, weights = _read(tmp_path / "out", stats, split)
        assert weights.tolist() == [weight_by_id[int(sparse[0].row(r)[0])] for r in range(len(weights))]


def test_an_unweighted_dataset_reads_as_before_and_weighs_one(tmp_path):
    rng = random.Random(3)
    stats = _prepare(tmp_path, "".join(_raw_line(rng, key, "")[:-1] + "\n" for key in range(300)), "raw", None)
    assert "weighted" not in stats["schema"] and stats["slot_names"][:2] == ["click", "dense"]
    paths = [tmp_path / "out" / p for p in stats["shards"]["train"]]
    schema = Schema.from_dict(stats["schema"])
    assert len(read_shards(paths, schema)) == 3
    labels, _, _, weights = read_shards(paths, schema, with_weights=True)
    assert weights.tolist() == [1.0] * len(labels)


def _row_key(labels, dense, sparse, row: int) -> tuple:
    return int(labels[row]), tuple(dense[row].tolist()), tuple(tuple(s.row(row).tolist()) for s in sparse)


def test_a_row_of_weight_two_reads_as_the_row_twice(tmp_path):
    """Every row in one split or another: the dataset's rows expanded by their weights are the rows of the input
    with each row written as many times as its weight."""
    rng = random.Random(4)
    rows = [(_raw_line(rng, key, "")[:-1], 1 + key % 3) for key in range(600)]
    for name in ("weighted", "repeated"):
        (tmp_path / name).mkdir()
    weighted = _prepare(tmp_path / "weighted", "".join(f"{line}\t{w}\n" for line, w in rows), "raw", "40")
    repeated = _prepare(tmp_path / "repeated", "".join(f"{line}\t1\n" * w for line, w in rows), "raw", "40")

    def expanded(root: Path, stats: dict) -> Counter:
        total: Counter = Counter()
        for split in SPLITS:
            labels, dense, sparse, weights = _read(root / "out", stats, split)
            for row, weight in enumerate(weights):
                total[_row_key(labels, dense, sparse, row)] += weight
        return total

    assert expanded(tmp_path / "weighted", weighted) == expanded(tmp_path / "repeated", repeated)
    assert sum(weighted["rows"].values()) == 600 and sum(repeated["rows"].values()) == 1200


@pytest.mark.parametrize("fmt,weight_column,bad,shown", [
    ("raw", "40", "abc", "has weight 'abc', which is not a finite number"),
    ("raw", "40", "-0.5", "has weight '-0.5', which is negative"),
    ("raw", "40", "", "has no weight"),
    ("raw", "40", None, "has no weight"),  # the line ends after Criteo's 40 fields
    ("slot", "weight", "inf", "has weight 'inf', which is not a finite number"),
    ("slot", "weight", None, "has no weight"),
    ("feasign", "w", "x", "has weight 'x', which is not a finite number"),
])
def test_a_row_without_a_usable_weight_refuses_the_input_in_one_line(tmp_path, fmt, weight_column, bad, shown):
    rng = random.Random(5)

    def line(key: int, weight: str | None) -> str:
        if fmt == "raw":
            row = _raw_line(rng, key, weight or "")
            return row if weight is not None else row[:row.rindex("\t")]
        token = "" if weight is None else f" {weight_column}:{weight}"
        if fmt == "slot":
            dense = " ".join(["dense_feature:1"] * 13)
            return f"click:0 {dense}{token} " + " ".join(f"{n}:{key}" for n in range(1, 27))
        return f"0:1 {key}:2{token}"

    lines = [line(key, "1.5") for key in range(3000)]
    lines[2345] = line(2345, bad)
    with pytest.raises(DataPrepError) as err:
        _prepare(tmp_path, "\n".join(lines) + "\n", fmt, weight_column, unit_bytes=16 << 10, processes=2)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'in.txt'}:2346: the row {shown}") and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_a_malformed_row_is_skipped_whatever_its_weight(tmp_path):
    rng = random.Random(6)
    lines = [_raw_line(rng, key, "1") for key in range(200)]
    lines[7] = "x" + lines[7][1:-1] + "oops"  # a bad label: malformed, counted, its weight unread
    stats = _prepare(tmp_path, "\n".join(lines), "raw", "40", max_malformed_fraction=0.01)
    assert stats["malformed"]["count"] == 1 and sum(stats["rows"].values()) == 199


def test_a_weight_column_the_format_cannot_hold_is_refused(tmp_path):
    for fmt, column in (("raw", "39"), ("raw", "w"), ("slot", "click"), ("slot", "7"), ("feasign", "7"),
                        ("feasign", "a:b")):
        with pytest.raises(DataPrepError, match=f"data.weight_column={column!r}"):
            _prepare(tmp_path, "0:1 5:2\n", fmt, column)


def test_the_weight_slot_follows_the_label_in_the_multislot_contract(tmp_path):
    schema = Schema(2, ["a"], weighted=True)
    line = format_line(1, [0.5, 0.25], [[7]], schema, weight=2.5)
    assert line == "1 1 1 2.5 2 0.5 0.25 1 7"
    assert parse_line(line, schema) == (1, [0.5, 0.25], [[7]], 2.5)
    assert schema.slot_names() == ["click", "weight", "dense", "a"] and Schema.from_dict(schema.to_dict()) == schema
    (tmp_path / "s.txt").write_text(line + "\n" + format_line(0, [1.0, 2.0], [[8]], schema, weight=0.0) + "\n")
    assert read_shards([tmp_path / "s.txt"], schema, with_weights=True)[3].tolist() == [2.5, 0.0]
    for bad, reason in (("1 1 1 -1 2 0.5 0.25 1 7", "weight must be a finite number >= 0"),
                        ("1 1 2 0.5 0.25 1 7", "weight slot must hold exactly one value")):  # an unweighted line
        (tmp_path / "bad.txt").write_text(bad + "\n")
        with pytest.raises(ValueError, match=f"bad.txt:1: {reason}"):
            read_shards([tmp_path / "bad.txt"], schema)
    with pytest.raises(ValueError, match="weight must be a finite number >= 0"):
        format_line(1, [0.0, 0.0], [[1]], schema, weight=float("nan"))
