"""The transform (components.data_prep.transform): raw records and serving instances become exactly the rows data
prep wrote for them, in every format; bad instances are refused in one line; transform.json describes it fully."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from components.data_prep.hashing import HASH_FUNCTION, feature_id
from components.data_prep.id_counts import OOV_VALUE, oov_id
from components.data_prep.multislot import Schema, read_shard_bytes, read_shards, text_bytes
from components.data_prep.prepare import prepare_synthetic
from components.data_prep.raw_format import DENSE_LOG_CAP
from components.data_prep.synthetic import category_value, generate
from components.data_prep.transform import (ID_COUNTS_FILE, TRANSFORM_DIR, TRANSFORM_FILE, InstanceError, Transform,
                                            TransformError)
from tests.data_prep.inputs import instances_of, prepare_records, record_lines, shard_files

VOCAB = 5000  # small: ids of different values meet, as in a real table
CASES = {"raw": ("raw", False, 1), "raw-min-id-count-2": ("raw", False, 2), "raw-weighted": ("raw", True, 1),
         "slot": ("slot", False, 1), "slot-weighted": ("slot", True, 1), "feasign": ("feasign", False, 1),
         "feasign-weighted": ("feasign", True, 2)}


def assert_same_rows(records, dense: np.ndarray, sparse: list) -> None:
    """Bit-identical dense values and ids."""
    assert records.dense.dtype == np.float32 and np.array_equal(records.dense, dense)
    assert len(records.sparse) == len(sparse)
    for got, want in zip(records.sparse, sparse):
        assert np.array_equal(got.offsets, want.offsets) and np.array_equal(got.values, want.values)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    fmt, weighted, min_id_count = CASES[request.param]
    lines = record_lines(fmt, 400, weighted)
    out = tmp_path_factory.mktemp(request.param) / "data"
    stats = prepare_records(out, fmt, lines, VOCAB, weighted, min_id_count)
    return fmt, weighted, lines, out, stats


def test_records_and_instances_give_the_rows_data_prep_wrote(case):
    fmt, weighted, lines, out, stats = case
    schema = Schema.from_dict(stats["schema"])
    _, dense, sparse = read_shards(shard_files(out, stats), schema)
    assert len(dense) == len(lines)
    transform = Transform.load(out / TRANSFORM_DIR)
    assert transform.schema == schema and transform.vocab_size == VOCAB
    records = transform.rows_of_records(("\n".join(lines) + "\n").encode())
    assert records.malformed == []
    assert_same_rows(records, dense, sparse)
    objects = [instances_of(fmt, line, transform.columns, weighted) for line in lines]
    assert_same_rows(transform.rows_of_instances(objects), dense, sparse)
    as_lists = [[instance.get(column) for column in transform.columns] for instance in objects]
    assert_same_rows(transform.rows_of_instances(as_lists), dense, sparse)
    if fmt == "raw":  # the numbers themselves, as a JSON client sends them
        numeric = [[int(v) if column.startswith("I") and v else v for column, v in zip(transform.columns, row)]
                   for row in as_lists]
        assert_same_rows(transform.rows_of_instances(numeric), dense, sparse)
        # Every field text, missing ones "": the plain instances' path makes the line the field checks make.
        texts = [[v or "" for v in row] for row in as_lists]
        assert [transform._plain_raw_line(row) for row in texts] == [
            transform._line(i, transform._fields(i, row)) for i, row in enumerate(texts)]
        assert_same_rows(transform.rows_of_instances(texts), dense, sparse)


def test_the_count_filter_travels_with_the_transform(case):
    fmt, _, lines, out, stats = case
    transform = Transform.load(out / TRANSFORM_DIR)
    files = sorted(p.name for p in (out / TRANSFORM_DIR).iterdir())
    if stats["min_id_count"] == 1:
        assert files == [TRANSFORM_FILE] and transform.id_counts is None
        return
    assert files == [ID_COUNTS_FILE, TRANSFORM_FILE]
    assert isinstance(transform.id_counts.table, np.memmap)  # mapped, not read
    # An id the train split never held is its slot's OOV id, as in the test shard.
    slot = transform.schema.sparse_slots[0]
    ids = transform.rows_of_instances([{slot: "never-seen" if fmt == "raw" else 987654321}]).sparse[0].values
    assert ids.tolist() == [oov_id(slot, VOCAB)] and stats["oov"]["ids"][slot] == oov_id(slot, VOCAB)


# Lines every format's parser must take both ways: blank and malformed lines, missing values, and (raw) counts past
# the small counts' table, negative ones and, in a block of its own, a count that is not an integer.
_ODD_LINES = {
    "raw": ["", "1\t" + "\t" * 38, "0\t1000000\t-3\t70000\t" + "\t".join(["5"] * 10) + "\tab" * 26, "2\tx",
            "1\tnot-a-count" + "\t" * 38],
    "slot": ["", "click:1 " + " ".join(["dense_feature:1e+20"] * 13), "click:0 dense_feature:1", "bad token"],
    "feasign": ["", "1:1 18446744073709551615:2", "0:1 5:2 5:2 5:3", "2:1 3:4", "x"],
}


@pytest.mark.parametrize("extra", ["none", "odd", "non-integer-count"])
def test_the_parsers_arrays_are_what_its_text_reads_back_as(case, extra):
    """One parser, two outputs: the arrays the transform reads (with_text=False, with_dense=True) equal the rows of
    the MultiSlot text data prep writes, read back as the trainer reads it, for every format, weighted or not, with a
    count filter or not."""
    fmt, weighted, lines, out, _ = case
    transform = Transform.load(out / TRANSFORM_DIR)
    odd = _ODD_LINES[fmt]
    if fmt == "raw" and extra == "odd":
        odd = odd[:-1]  # a count that is not an integer reads the whole block's counts as text: the third case
    if weighted:
        weight = {"raw": "\t1.5", "slot": " weight:1.5", "feasign": " w:1.5"}[fmt]
        odd = [line + weight if line.strip() else line for line in odd]
    block = "\n".join(lines[:150] + ({"none": [], "odd": odd, "non-integer-count": odd}[extra])) + "\n"
    if extra == "non-integer-count" and fmt == "raw":
        block = block.replace("\t70000\t", "\t2.5\t")
    arrays = transform._parser
    parsed = arrays.parse(block.encode())
    text = dataclasses.replace(arrays, with_text=True, with_dense=False).parse(block.encode())
    assert text.dense is None and parsed.text is None
    assert parsed.malformed == text.malformed and np.array_equal(parsed.row_lines, text.row_lines)
    good_odd = 0 if extra == "none" else {"raw": 2, "slot": 1, "feasign": 2}[fmt]
    assert len(parsed.labels) == 150 + good_odd and np.array_equal(parsed.labels, text.labels)
    _, dense, sparse, _ = read_shard_bytes(bytes(text_bytes(text.text)), transform.schema, "text")
    assert parsed.dense.dtype == np.float32 and parsed.dense.tobytes() == dense.tobytes()
    for got, want in zip(parsed.sparse(), sparse):
        assert np.array_equal(got.offsets, want.offsets) and np.array_equal(got.values, want.values)
        assert got.values.dtype == np.int64
    assert np.array_equal(parsed.missing, text.missing)
    assert len(parsed.malformed) == (len([line for line in odd if line.strip()]) - good_odd if extra != "none" else 0)
    if fmt == "raw" and extra != "none":  # an all-missing row; a count past the small counts' table
        assert parsed.dense[150].tolist() == [0.0] * 13
        assert parsed.dense[151, 0] == np.float32(math.log1p(1000000) / DENSE_LOG_CAP)
        assert parsed.dense[151, 2] == np.float32(math.log1p(2.5 if extra == "non-integer-count" else 70000)
                                                  / DENSE_LOG_CAP)


def test_transform_json_describes_the_mapping_fully(tmp_path):
    stats = prepare_records(tmp_path / "data", "raw", record_lines("raw", 200), VOCAB, min_id_count=2)
    described = json.loads((tmp_path / "data" / TRANSFORM_DIR / TRANSFORM_FILE).read_text())
    assert described["transform_version"] == 1
    assert described["input"]["format"] == "raw" and described["input"]["label_column"] == "label"
    assert described["input"]["instance_columns"] == [*(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
    assert described["ids"]["hash_function"] == HASH_FUNCTION and described["ids"]["vocab_size"] == VOCAB
    assert described["ids"]["slot_key_prefix"]["C7"] == "C7\x1f"
    assert described["missing"]["value"] == "<missing>"
    assert described["id_counts"]["min_id_count"] == 2 and described["id_counts"]["oov_value"] == OOV_VALUE
    assert described["id_counts"]["oov_ids"] == stats["oov"]["ids"] and described["id_counts"]["file"] == ID_COUNTS_FILE
    assert described["dense"]["log_cap"] == DENSE_LOG_CAP and described["dense"]["missing"] == 0.0
    assert described["schema"] == stats["schema"]
    # What it says is what it does: a value hashed with its slot's prefix, a missing one as <missing>.
    transform = Transform.load(tmp_path / "data" / TRANSFORM_DIR)
    row = transform.rows_of_instances([{"C1": "00000001", "I1": 1000}])
    assert row.sparse[0].values[0] in (feature_id("C1", "00000001", VOCAB), oov_id("C1", VOCAB))
    assert row.dense[0, 0] == np.float32(min(math.log1p(1000) / DENSE_LOG_CAP, 1.0)) and row.dense[0, 1] == 0.0


def test_no_record_is_no_row():
    transform = Transform("raw", Schema(13, [f"C{i}" for i in range(1, 27)]), VOCAB)
    for records in (transform.rows_of_instances([]), transform.rows_of_records(b"\n \n")):
        assert records.dense.shape == (0, 13) and [len(s.offsets) for s in records.sparse] == [1] * 26


def test_an_unknown_transform_version_is_refused_in_one_line(tmp_path):
    prepare_records(tmp_path / "data", "raw", record_lines("raw", 200), VOCAB)
    path = tmp_path / "data" / TRANSFORM_DIR / TRANSFORM_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "transform_version": 2}))
    with pytest.raises(TransformError, match=r"^transform version 2 is not one this code reads [^\n]*$"):
        Transform.load(path.parent)


@pytest.mark.parametrize("fmt,instance,message", [
    ("raw", {"C7": ["a", "b"]}, "instance 1, field C7: expected a string or a number, got a list"),
    ("raw", {"C99": "x"}, "instance 1, field C99: unknown column"),
    ("raw", [""] * 40, "instance 1, field 39: too many fields"),
    ("raw", [""] * 12, "instance 1, field I13: absent"),
    ("raw", {"C3": "a\tb"}, "instance 1, field C3: a tab or newline inside a value"),
    ("raw", {"C3": "a\nb"}, "instance 1, field C3: a tab or newline inside a value"),
    ("raw", {"I2": "twelve"}, "instance 1, field I2: not a finite number: 'twelve'"),
    ("raw", {"I2": True}, "instance 1, field I2: expected a string or a number, got bool"),
    ("raw", "C1=3", "instance 1: expected a list or an object, got str"),
    ("slot", {"dense_feature": [1.0] * 12}, "instance 1, field dense_feature: expected 13 numbers, got 12"),
    ("slot", {"3": "a b"}, "instance 1, field 3: whitespace inside a value"),
    ("slot", {"3": {"a": 1}}, "instance 1, field 3: expected a string or a number or a list of them, got dict"),
    ("feasign", {"4": 12}, "instance 1, field 4: unknown column"),
    ("feasign", {"2": "x"}, "instance 1: token 'x:2' is not <uint64 feasign>:<slot id>"),
])
def test_a_bad_instance_is_refused_naming_its_index_and_field(fmt, instance, message):
    schema = Schema(0, ["2", "3"]) if fmt == "feasign" else Schema(13, [f"C{i}" for i in range(1, 27)])
    transform = Transform(fmt, schema, VOCAB)
    good = {"raw": {"C1": "ab"}, "slot": {"dense_feature": [0.5] * 13}, "feasign": {"2": 7}}[fmt]
    with pytest.raises(InstanceError) as raised:
        transform.rows_of_instances([good, instance])
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_synthetic_rows_are_raw_records(tmp_path):
    """The default run's source: its rows are raw Criteo records (write_raw_tsv's form), so its transform is the raw
    one; their ids are the shards' bit for bit, their dense values the same to float32 rounding (the generator
    writes them with 6 significant digits)."""
    stats = prepare_synthetic(tmp_path / "data", rows=300, test_fraction=0.2, num_shards=1, vocab_size=VOCAB, seed=4)
    transform = Transform.load(tmp_path / "data" / TRANSFORM_DIR)
    assert transform.fmt == "raw" and transform.schema == Schema.from_dict(stats["schema"])
    rows = generate(300, 4)
    lines = ["\t".join([str(label), *(str(c) if c else "" for c in counts), *map(category_value, categories)])
             for label, counts, categories in zip(rows.labels, rows.dense_counts, rows.categories)]
    records = transform.rows_of_records(("\n".join(lines) + "\n").encode())
    _, dense, sparse = read_shards(shard_files(tmp_path / "data", stats), transform.schema)
    for got, want in zip(records.sparse, sparse):
        assert np.array_equal(got.values, want.values)
    assert np.abs(records.dense - dense).max() <= 1e-6
