"""Tests of the data-prep core: MultiSlot format, hashing, synthetic data, input formats, prepare."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from components.data_prep.hashing import feature_id, feature_ids
from components.data_prep.multislot import Schema, format_line, parse_line, read_shards
from components.data_prep.prepare import DataPrepError, prepare_files, prepare_synthetic
from components.data_prep.formats import CRITEO_SLOTS, MISSING_VALUE, BlockParser, schema_for
from components.data_prep.synthetic import (
    SPECS,
    SyntheticSpec,
    bayes_metrics,
    category_value,
    generate,
)
from components.data_prep.synthetic import main as synthetic_main

from tests.conftest import CRITEO as SAMPLES
from tests.conftest import ROOT
from tests.conftest import needs_criteo as needs_samples

RAW_SAMPLE = SAMPLES / "raw_criteo_sample.tsv"
SLOT_SAMPLE = SAMPLES / "paddlerec_slot_sample.txt"
FEASIGN_SAMPLE = SAMPLES / "paddlerec_feasign_slot_demo.txt"
SMALL_SCHEMA = Schema(dense_dim=2, sparse_slots=["a", "b"])


def _raw_line(label: str = "1", dense: str = "5", category: str = "05db9164") -> str:
    return "\t".join([label] + [dense] * 13 + [category] * 26)


def _load(out_dir: Path, stats: dict, split: str):
    paths = [out_dir / path for path in stats["shards"][split]]
    return read_shards(paths, Schema.from_dict(stats["schema"]))


def _prepare_raw(tmp_path: Path, uri: Path | str, **overrides) -> dict:
    settings = dict(
        uri=str(uri), fmt="raw", test_fraction=0.3, num_shards=1, vocab_size=1 << 20, seed=0,
        max_malformed_fraction=0.5,
    )  # fmt: skip
    settings.update(overrides)
    return prepare_files(tmp_path / "out", **settings)


# --- MultiSlot format -------------------------------------------------------------------


def test_format_line_matches_the_multislot_contract():
    line = format_line(0, [0.5, 0.25], [[1234], [77, 78]], SMALL_SCHEMA)
    assert line == "1 0 2 0.5 0.25 1 1234 2 77 78"
    assert parse_line(line, SMALL_SCHEMA) == (0, [0.5, 0.25], [[1234], [77, 78]], 1.0)  # unweighted: weight 1
    assert SMALL_SCHEMA.slot_names() == ["click", "dense", "a", "b"]
    assert SMALL_SCHEMA.slot_dtypes() == ["int64", "float32", "int64", "int64"]


def test_schema_without_dense_omits_the_dense_slot():
    schema = Schema(dense_dim=0, sparse_slots=["2", "3"])
    line = format_line(1, [], [[5], [6, 7]], schema)
    assert line == "1 1 1 5 2 6 7"
    assert schema.slot_names() == ["click", "2", "3"]
    assert parse_line(line, schema) == (1, [], [[5], [6, 7]], 1.0)


def test_floats_are_compact_and_round_trip_within_float32():
    line = format_line(1, [1e-7, 123456789.0], [[1], [2]], SMALL_SCHEMA)
    assert line.split()[3:5] == ["1e-07", "1.23457e+08"]


@pytest.mark.parametrize(
    ("label", "dense", "sparse", "message"),
    [
        (2, [0, 0], [[1], [2]], "label"),
        (1, [0], [[1], [2]], "dense"),
        (1, [0, 0], [[1], []], "empty"),
        (1, [0, 0], [[1]], "sparse slots"),
    ],
)
def test_format_line_rejects_what_paddle_would_reject(label, dense, sparse, message):
    with pytest.raises(ValueError, match=message):
        format_line(label, dense, sparse, SMALL_SCHEMA)


@pytest.mark.parametrize(
    "line",
    ["1 0 2 0.5 0.25 1 1234 2 77", "1 0 2 0.5 0.25 0 1 2 77 78", "1 2 2 0 0 1 1 1 1",
     "1 0 2 0.5 0.25 1 1 1 1 9", "1 0 1 0.5 1 1 1 1"],
)  # fmt: skip
def test_parse_line_rejects_malformed_lines(line):
    with pytest.raises(ValueError):
        parse_line(line, SMALL_SCHEMA)


def test_read_shards_matches_parse_line(tmp_path):
    lines = [
        format_line(1, [0.5, -2.0], [[1234], [77, 78]], SMALL_SCHEMA),
        format_line(0, [1e-7, 3.0], [[1], [2]], SMALL_SCHEMA),
        format_line(0, [4.0, 5.0], [[5, 6, 7], [9]], SMALL_SCHEMA),
    ]
    (tmp_path / "a.txt").write_text(lines[0] + "\n\n" + lines[1] + "\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "b.txt").write_text(lines[2])  # no trailing newline
    labels, dense, sparse = read_shards(
        [tmp_path / "a.txt", tmp_path / "empty.txt", tmp_path / "b.txt"], SMALL_SCHEMA
    )
    assert labels.dtype == np.int64 and dense.dtype == np.float32 and dense.shape == (3, 2)
    for row, line in enumerate(lines):
        expected = parse_line(line, SMALL_SCHEMA)
        assert labels[row] == expected.label
        np.testing.assert_allclose(dense[row], expected.dense, rtol=1e-6)
        for slot, ids in zip(sparse, expected.sparse):
            assert slot.row(row).tolist() == ids


def test_read_shards_reads_any_whitespace_and_every_number_float_takes(tmp_path):
    """Tabs, CR LF, runs of spaces, blank lines of spaces; numbers Arrow's cast refuses but ``float()`` takes
    (``1_0``): read as ``parse_line`` reads them."""
    lines = ["  1 0\t2 0.5  0.25 1 1234 2 77 78\r", " \t ", "1 1 2 1e-3 -2 1 1_0 1 7"]
    (tmp_path / "odd.txt").write_bytes("\n".join(lines).encode())
    labels, dense, sparse = read_shards([tmp_path / "odd.txt"], SMALL_SCHEMA)
    for row, line in enumerate([lines[0], lines[2]]):
        expected = parse_line(line, SMALL_SCHEMA)
        assert labels[row] == expected.label
        assert dense[row].tolist() == np.float32(expected.dense).tolist()
        assert [slot.row(row).tolist() for slot in sparse] == expected.sparse
    (tmp_path / "latin1.txt").write_bytes(b"1 0 2 0.5 0.25 1 1\n1 0 2 0.5 0.25 1 \xe9 1 2\n")
    with pytest.raises(ValueError, match=r"latin1.txt:2: b'\\xe9' is not a number"):
        read_shards([tmp_path / "latin1.txt"], SMALL_SCHEMA)


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [("1 0 2 0.5 0.25 1 1234 2 77", "announces more values"),
     ("1 0 2 0.5 0.25 1 x 2 77 78", "not a number"),
     ("1 3 2 0.5 0.25 1 1 1 1", "label"),
     ("1 0 2 0.5 0.25 1 1 1 1 7", "trailing")],
)  # fmt: skip
def test_read_shards_names_file_and_line_of_a_bad_example(tmp_path, bad_line, reason):
    good = format_line(1, [0.5, 0.25], [[1], [2]], SMALL_SCHEMA)
    shard = tmp_path / "shard.txt"
    shard.write_text(f"{good}\n{bad_line}\n")
    with pytest.raises(ValueError, match=reason) as error:
        read_shards([shard], SMALL_SCHEMA)
    assert f"{shard}:2" in str(error.value)


# --- hashing ------------------------------------------------------------------------------


def test_feature_ids_are_in_range_and_vectorised_matches_scalar():
    values = [str(index) for index in range(2000)] + ["", "é", MISSING_VALUE]
    for vocab_size in (1, 7, 1 << 10, (1 << 53)):
        ids = feature_ids("C1", values, vocab_size)
        assert ids.min() >= 0 and ids.max() < vocab_size
        assert ids.tolist() == [feature_id("C1", value, vocab_size) for value in values]
    assert feature_id("C1", 23, 1000) == feature_id("C1", "23", 1000)
    assert feature_id("C1", "23", 1 << 30) != feature_id("C12", "3", 1 << 30)
    # Small power-of-two vocabularies still spread keys (thanks to the finaliser).
    assert len(set(feature_ids("C1", values[:200], 8).tolist())) == 8


def test_feature_ids_are_identical_in_another_process():
    values = ["05db9164", "", "123", MISSING_VALUE]
    script = (
        "from components.data_prep.hashing import feature_id;"
        f"print([feature_id('C7', v, 1 << 20) for v in {values!r}])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    output = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env,
        cwd=ROOT,
    ).stdout  # fmt: skip
    assert json.loads(output) == [feature_id("C7", value, 1 << 20) for value in values]


def test_vocab_size_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        feature_id("C1", "x", 0)


# --- synthetic ----------------------------------------------------------------------------


def test_synthetic_same_seed_is_byte_identical_and_other_seed_differs(tmp_path):
    settings = dict(rows=3000, test_fraction=0.2, num_shards=2, vocab_size=1 << 16)

    def shard_bytes(name: str, seed: int) -> list[bytes]:
        out = tmp_path / name
        stats = prepare_synthetic(out, seed=seed, **settings)
        paths = [*stats["shards"]["train"], *stats["shards"]["test"], "stats.json"]
        return [(out / path).read_bytes() for path in paths]

    first = shard_bytes("first", seed=3)
    assert shard_bytes("again", seed=3) == first
    other = shard_bytes("other", seed=4)
    assert all(a != b for a, b in zip(first, other))


def test_synthetic_dataset_is_criteo_like_with_bayes_metrics_of_the_test_split(tmp_path):
    out = tmp_path / "synthetic"
    vocab_size = 1 << 18
    stats = prepare_synthetic(out, rows=20_000, test_fraction=0.25, valid_fraction=0.1, num_shards=3,
                              vocab_size=vocab_size, seed=0)  # fmt: skip
    assert stats["rows"] == {"train": 13_000, "valid": 2_000, "test": 5_000}  # test rows last, valid before
    assert stats["shard_rows"]["train"] == [4334, 4333, 4333]
    assert json.loads((out / "stats.json").read_text()) == stats
    assert stats["schema"] == {"dense_dim": 13, "sparse_slots": [f"C{i}" for i in range(1, 27)]}
    assert all(0.2 <= ctr <= 0.3 for ctr in stats["ctr"].values())
    assert 0.75 <= stats["bayes"]["auc"] <= 0.9
    assert 0.3 < stats["bayes"]["logloss"] < 0.56  # below the constant-CTR logloss

    # Recorded Bayes metrics are those of the true probabilities on the test rows.
    rows = generate(20_000, 0)
    assert stats["bayes"] == bayes_metrics(rows.labels[15_000:], rows.probabilities[15_000:])

    labels, dense, sparse = _load(out, stats, "test")
    assert len(labels) == 5000 and labels.mean() == pytest.approx(stats["ctr"]["test"])
    assert dense.min() >= 0.0 and dense.max() <= 1.0
    # Row order is round-robin over shards: shard 0 holds test rows 0, 3, 6, ...
    first_row = 15_000
    for field, slot in enumerate(sparse):
        raw_value = category_value(rows.categories[first_row, field])
        expected = feature_id(f"C{field + 1}", raw_value, vocab_size)
        assert slot.row(0).tolist() == [expected]
        assert slot.values.max() < vocab_size
    cardinalities = SyntheticSpec().cardinalities
    assert min(cardinalities) < 10 and max(cardinalities) > 10_000
    assert stats["distinct_ids"]["C9"] <= 3 < stats["distinct_ids"]["C3"]

    # The vectorised writer produces exactly what format_line would.
    schema = Schema.from_dict(stats["schema"])
    for line in (out / "train" / "part-00001.txt").read_text().splitlines()[:50]:
        label, dense, sparse, weight = parse_line(line, schema)
        assert format_line(label, dense, sparse, schema, weight) == line


# --- real samples -------------------------------------------------------------------------


@needs_samples
@pytest.mark.parametrize(
    ("fmt", "sample", "lines", "dense_dim", "test_fraction"),
    [("raw", RAW_SAMPLE, 100, 13, 0.05), ("slot", SLOT_SAMPLE, 80, 13, 0.05),
     ("feasign", FEASIGN_SAMPLE, 10, 0, 0.2)],
)  # fmt: skip
def test_real_samples_parse_fully(tmp_path, fmt, sample, lines, dense_dim, test_fraction):
    vocab_size = 5000
    out = tmp_path / fmt
    stats = prepare_files(out, uri=str(sample), fmt=fmt, test_fraction=test_fraction, num_shards=1,
                          vocab_size=vocab_size, seed=1, max_malformed_fraction=0.0)  # fmt: skip
    assert stats["malformed"]["count"] == 0
    assert stats["rows"]["train"] + stats["rows"]["test"] == lines
    assert stats["rows"]["test"] >= 1
    assert stats["schema"]["dense_dim"] == dense_dim
    assert stats["bayes"] is None and stats["format"] == fmt
    schema = Schema.from_dict(stats["schema"])
    all_rows = [_load(out, stats, split) for split in ("train", "test")]
    assert sum(len(labels) for labels, _, _ in all_rows) == lines
    for _, _, sparse in all_rows:
        assert len(sparse) == len(schema.sparse_slots)
        for slot in sparse:
            assert slot.values.min() >= 0 and slot.values.max() < vocab_size
            assert (np.diff(slot.offsets) >= 1).all()  # no empty slot


@needs_samples
def test_raw_sample_ids_are_hashes_of_the_raw_values(tmp_path):
    stats = _prepare_raw(tmp_path, RAW_SAMPLE, vocab_size=1 << 20)
    rows = RAW_SAMPLE.read_text().splitlines()
    c1_values = {row.split("\t")[14] or MISSING_VALUE for row in rows}
    written = set()
    for split in ("train", "test"):
        written.update(_load(tmp_path / "out", stats, split)[2][0].values.tolist())
    assert written == {feature_id("C1", value, 1 << 20) for value in c1_values}
    labels = [int(row.split("\t")[0]) for row in rows]
    clicks = sum(stats["ctr"][split] * stats["rows"][split] for split in ("train", "test"))
    assert round(clicks) == sum(labels)


@needs_samples
def test_feasign_sample_keeps_multivalued_slots_and_fills_missing_ones(tmp_path):
    stats = prepare_files(tmp_path / "out", uri=str(FEASIGN_SAMPLE), fmt="feasign", test_fraction=0.2, num_shards=1,
                          vocab_size=1 << 20, seed=1, max_malformed_fraction=0.0)
    schema = Schema.from_dict(stats["schema"])
    assert schema.dense_dim == 0 and "1" not in schema.sparse_slots and schema.sparse_slots[0] == "2"
    slot_ids = [int(slot) for slot in schema.sparse_slots]
    assert slot_ids == sorted(slot_ids)
    first_line = FEASIGN_SAMPLE.read_text().splitlines()[0]
    parsed = BlockParser("feasign", schema, 1 << 20).parse((first_line + "\n").encode())
    label, _, sparse, _ = parse_line(parsed.text.to_pylist()[0], schema)
    assert label == int(first_line.split()[0].split(":")[0])
    assert max(len(ids) for ids in sparse) > 1
    missing = [feature_id(slot, MISSING_VALUE, 1 << 20) for slot in schema.sparse_slots]
    assert any(ids == [m] for ids, m in zip(sparse, missing))


@needs_samples
def test_glob_over_several_files_including_gzip(tmp_path):
    rows = RAW_SAMPLE.read_text().splitlines(keepends=True)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "part-a.tsv").write_text("".join(rows[:30]))
    (inputs / "part-b.tsv").write_text("".join(rows[30:60]))
    with gzip.open(inputs / "part-c.tsv.gz", "wt") as handle:
        handle.write("".join(rows[60:]))
    (inputs / "notes.md").write_text("not matched by the glob\n")
    glob = f"{inputs}/part-*.tsv*"
    stats = _prepare_raw(tmp_path, glob, num_shards=2, max_malformed_fraction=0.0)
    assert stats["rows"]["train"] + stats["rows"]["test"] == 100
    # A directory URI reads every file below it, here including the stray notes file.
    with pytest.raises(DataPrepError, match="malformed"):
        _prepare_raw(tmp_path, inputs, max_malformed_fraction=0.0)


# --- malformed input and errors -----------------------------------------------------------


def _write_raw_with_bad_lines(path: Path) -> None:
    lines = [_raw_line() for _ in range(20)]
    lines[2] = "1\t2\t3"  # line 3: bad field count
    lines[4] = _raw_line(dense="abc")  # line 5: non-numeric dense
    lines[6] = _raw_line(label="2")  # line 7: bad label
    lines[8] = ""  # line 9: blank, skipped
    path.write_text("\n".join(lines) + "\n")


def test_malformed_lines_are_counted_and_reported_with_file_and_line(tmp_path):
    source = tmp_path / "bad.tsv"
    _write_raw_with_bad_lines(source)
    stats = _prepare_raw(tmp_path, source, max_malformed_fraction=0.2)
    assert stats["rows"]["train"] + stats["rows"]["test"] == 16
    malformed = stats["malformed"]
    assert malformed["count"] == 3 and malformed["fraction"] == pytest.approx(3 / 19)
    where = [(example["file"], example["line"]) for example in malformed["examples"]]
    assert where == [(str(source), 3), (str(source), 5), (str(source), 7)]
    reasons = [example["reason"] for example in malformed["examples"]]
    assert "40 tab-separated fields" in reasons[0] and "found 3" in reasons[0]
    assert "I1" in reasons[1] and "'abc'" in reasons[1]
    assert "label" in reasons[2] and "'2'" in reasons[2]


def test_too_many_malformed_lines_fail_with_count_fraction_limit_and_lines(tmp_path):
    source = tmp_path / "bad.tsv"
    _write_raw_with_bad_lines(source)
    with pytest.raises(DataPrepError) as error:
        _prepare_raw(tmp_path, source, max_malformed_fraction=0.1)
    message = str(error.value)
    expected = ["3 of 19 lines", "0.1579", "max_malformed_fraction 0.1"]
    expected += [f"{source}:3", f"{source}:7"]
    assert all(part in message for part in expected), message
    assert not (tmp_path / "out").exists()
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".out")]


def test_malformed_slot_and_feasign_lines_are_reported():
    dense = " ".join(["dense_feature:0.5"] * 13)
    slot_lines = (f"click:1 {dense} 1:5 2:7 2:8\nclick:1 dense_feature:0.5 1:5\nclick:x {dense} 1:5\n"
                  f"click:0 {dense} 1:5 99:3\n")
    schema = schema_for("slot", None)
    parsed = BlockParser("slot", schema, 1 << 20).parse(slot_lines.encode())
    label, values, sparse, _ = parse_line(parsed.text.to_pylist()[0], schema)
    assert label == 1 and values == [0.5] * 13
    assert sparse[0] == [feature_id("C1", "5", 1 << 20)]
    assert sparse[1] == [feature_id("C2", "7", 1 << 20), feature_id("C2", "8", 1 << 20)]  # several, in line order
    assert sparse[2] == [feature_id("C3", MISSING_VALUE, 1 << 20)]
    assert [(line + 1, reason.split()[0]) for line, reason in parsed.malformed] == [
        (2, "expected"), (3, "label"), (4, "unknown")
    ]  # fmt: skip

    feasign_lines = "1:1 5:2 6:2 7:3\n5:2\n1:1 x:2\n3:1 4:2\n1:1 99999999999999999999:2\n"
    schema = schema_for("feasign", ["2", "3"])
    parsed = BlockParser("feasign", schema, 1 << 20).parse(feasign_lines.encode())
    assert parse_line(parsed.text.to_pylist()[0], schema) == (
        1, [], [[feature_id("2", "5", 1 << 20), feature_id("2", "6", 1 << 20)], [feature_id("3", "7", 1 << 20)]], 1.0)
    assert [(line + 1, reason) for line, reason in parsed.malformed] == [
        (2, "expected exactly one <0|1>:1 token, found 0"), (3, "token 'x:2' is not <uint64 feasign>:<slot id>"),
        (4, "label (slot 1) must be 0 or 1, got '3'"), (5, "feasign 99999999999999999999 does not fit in uint64")]
    with pytest.raises(DataPrepError, match="integer slot ids other than the label slot"):
        schema_for("feasign", ["1"])


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_input_is_an_error(tmp_path, content):
    source = tmp_path / "empty.tsv"
    source.write_text(content)
    with pytest.raises(DataPrepError, match="no data rows"):
        _prepare_raw(tmp_path, source)
    assert not (tmp_path / "out").exists()


def test_no_matching_file_is_an_error(tmp_path):
    with pytest.raises(DataPrepError, match="no input file matches"):
        _prepare_raw(tmp_path, tmp_path / "missing-*.tsv")


def test_a_split_without_a_row_per_shard_is_an_error(tmp_path):
    source = tmp_path / "tiny.tsv"
    source.write_text("\n".join(_raw_line() for _ in range(3)) + "\n")
    with pytest.raises(DataPrepError, match="num_shards=4"):
        _prepare_raw(tmp_path, source, num_shards=4)
    with pytest.raises(DataPrepError, match="test split"):
        prepare_synthetic(
            tmp_path / "s", rows=10, test_fraction=0.01, num_shards=1, vocab_size=100, seed=0
        )


def test_test_split_is_deterministic_per_seed(tmp_path):
    source = tmp_path / "data.tsv"
    source.write_text("\n".join(_raw_line(category=str(n)) for n in range(200)) + "\n")

    def test_ids(seed: int) -> list[int]:
        stats = _prepare_raw(tmp_path, source, seed=seed)
        return sorted(_load(tmp_path / "out", stats, "test")[2][0].values.tolist())

    assert test_ids(0) == test_ids(0)
    assert test_ids(0) != test_ids(1)
    assert 30 <= len(test_ids(0)) <= 90  # about test_fraction = 0.3 of 200


def test_rerun_replaces_a_dataset_but_never_a_foreign_directory(tmp_path):
    source = tmp_path / "data.tsv"
    source.write_text("\n".join(_raw_line() for _ in range(20)) + "\n")
    _prepare_raw(tmp_path, source)
    (tmp_path / "out" / "train" / "stale.txt").write_text("old")
    _prepare_raw(tmp_path, source)
    assert not (tmp_path / "out" / "train" / "stale.txt").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data.tsv", "out"]

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("precious")
    with pytest.raises(DataPrepError, match="refusing to overwrite"):
        prepare_files(foreign, uri=str(source), fmt="raw", test_fraction=0.3, num_shards=1,
                      vocab_size=100, seed=0, max_malformed_fraction=0.0)  # fmt: skip
    assert (foreign / "keep.txt").read_text() == "precious"


def test_slot_selection_and_unknown_slots(tmp_path):
    source = tmp_path / "data.tsv"
    source.write_text("\n".join(_raw_line() for _ in range(20)) + "\n")
    stats = _prepare_raw(tmp_path, source, slots=["C3", "C1"])
    assert stats["schema"]["sparse_slots"] == ["C3", "C1"]
    assert stats["slot_names"] == ["click", "dense", "C3", "C1"]
    with pytest.raises(DataPrepError, match="C99"):
        _prepare_raw(tmp_path, source, slots=["C99"])
    with pytest.raises(DataPrepError, match="unknown input format"):
        _prepare_raw(tmp_path, source, fmt="parquet")
    assert CRITEO_SLOTS[0] == "C1"


def test_the_plan_fingerprint_changes_when_a_matching_file_is_added_or_rewritten(tmp_path):
    """What keys the pipeline's prep cache: the same glob over new or rewritten files is not the same plan."""
    from components.data_prep.prepare import plan_files

    def fingerprint() -> str:
        return plan_files(uri=str(tmp_path / "day_*.tsv"), fmt="raw", test_fraction=0.3, num_shards=1,
                          vocab_size=1 << 20, seed=0, max_malformed_fraction=0.0).fingerprint

    (tmp_path / "day_0.tsv").write_text(_raw_line() + "\n")
    first = fingerprint()
    assert first == fingerprint()
    (tmp_path / "day_1.tsv").write_text(_raw_line() + "\n")
    added = fingerprint()
    assert added != first
    (tmp_path / "day_1.tsv").write_text(_raw_line(label="0") + "\n" + _raw_line() + "\n")  # rewritten, larger
    assert fingerprint() not in (first, added)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_named_generator_writes_raw_criteo_tsv_with_its_oracle(tmp_path, name):
    out = tmp_path / f"{name}.tsv"
    synthetic_main(["--spec", name, "--rows", "3000", "--seed", "1", "--out", str(out)])
    lines = out.read_text().splitlines()
    assert len(lines) == 3000 and {len(line.split("\t")) for line in lines} == {40}
    oracle = json.loads(Path(f"{out}.oracle.json").read_text())
    assert oracle["spec"] == name and 0.6 < oracle["auc"] < 1.0


def test_synthetic_rows_carry_the_interaction_part_of_their_logit():
    without = generate(2000, 3, SyntheticSpec(interaction_fields=0))
    assert not without.interaction_logits.any()
    rows = generate(2000, 3, SyntheticSpec(interaction_fields=4))
    assert rows.interaction_logits.std() > 0.01
    # The part depends on the interacting fields' categories only: rows equal there have equal parts.
    interacting = np.argsort(SyntheticSpec().cardinalities, kind="stable")[:4]
    keys = [tuple(row) for row in rows.categories[:, interacting]]
    first = {}
    for key, part in zip(keys, rows.interaction_logits):
        assert first.setdefault(key, part) == part
