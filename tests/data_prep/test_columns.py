"""The shards' columnar copy: data prep writes it beside every shard, :func:`read_shards` loads it instead of the
text and gets the very arrays the text parses into; a copy that is not of the text is passed over."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from components.data_prep.columns import COLUMN_PIECES
from components.data_prep.multislot import COLUMNS_INDEX, Schema, columns_dir, read_shard_bytes, read_shards
from components.data_prep.plan import SPLITS
from components.data_prep.prepare import prepare_files, prepare_synthetic
from tests.data_prep.inputs import dataset_files, record_lines, write_inputs


def _assert_same_rows(read: tuple, parsed: tuple) -> None:
    (labels, dense, sparse, weights), (text_labels, text_dense, text_sparse, text_weights) = read, parsed
    np.testing.assert_array_equal(labels, text_labels)
    assert labels.dtype == text_labels.dtype and dense.dtype == text_dense.dtype == np.float32
    np.testing.assert_array_equal(dense, text_dense)
    np.testing.assert_array_equal(weights, text_weights)
    assert len(sparse) == len(text_sparse)
    for slot, text_slot in zip(sparse, text_sparse):
        assert slot.values.dtype == slot.offsets.dtype == np.int64
        np.testing.assert_array_equal(slot.values, text_slot.values)
        np.testing.assert_array_equal(slot.offsets, text_slot.offsets)


def _shards(out: Path, stats: dict) -> list[Path]:
    return [out / rel for split in SPLITS for rel in stats["shards"][split]]


@pytest.mark.parametrize("fmt", ["raw", "slot", "feasign"])
def test_every_shard_has_a_copy_that_reads_as_its_text_parses(tmp_path, fmt):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(record_lines(fmt, 2500, weighted=True)) + "\n")
    # Small units, two processes: a shard's rows come from several units, each in several pieces.
    stats = prepare_files(tmp_path / "out", uri=str(source), fmt=fmt, test_fraction=0.2, valid_fraction=0.1,
                          num_shards=2, vocab_size=1 << 40, seed=3, max_malformed_fraction=0.0,
                          weight_column={"raw": "40", "slot": "weight", "feasign": "w"}[fmt], unit_bytes=50_000,
                          processes=2)
    schema = Schema.from_dict(stats["schema"])
    assert schema.weighted
    for shard in _shards(tmp_path / "out", stats):
        index = json.loads((columns_dir(shard) / COLUMNS_INDEX).read_text())
        assert index["text_bytes"] == shard.stat().st_size and len(index["pieces"]) > 1
        _assert_same_rows(read_shards([shard], schema, with_weights=True),
                          read_shard_bytes(shard.read_bytes(), schema, str(shard)))
    assert sorted(p.name for p in (tmp_path / "out" / "train").iterdir()) == ["part-00000.txt", "part-00001.txt"]


def test_the_copy_is_the_same_bytes_for_the_same_data(tmp_path):
    inputs = write_inputs(tmp_path / "in", lines=1200)
    options = dict(uri=f"{inputs}/part-*", fmt="raw", test_fraction=0.2, num_shards=2, vocab_size=1 << 20, seed=1,
                   max_malformed_fraction=0.0, unit_bytes=40_000)
    prepare_files(tmp_path / "one", processes=1, **options)
    prepare_files(tmp_path / "two", processes=2, **options)
    one = dataset_files(tmp_path / "one")
    assert any(name.startswith("columns/train/part-00000/") for name in one)
    assert one == dataset_files(tmp_path / "two")


def test_a_copy_that_is_not_of_the_text_is_passed_over(tmp_path):
    stats = prepare_synthetic(tmp_path / "out", rows=3000, test_fraction=0.1, num_shards=1, vocab_size=1 << 16, seed=2)
    schema = Schema.from_dict(stats["schema"])
    shard = tmp_path / "out" / stats["shards"]["train"][0]
    lines = shard.read_text().splitlines(keepends=True)
    index = columns_dir(shard) / COLUMNS_INDEX
    recorded = index.read_text()

    # Read from the copy: a label flipped in the text, its size kept, is not seen.
    label = read_shards([shard], schema)[0][0]
    assert lines[0].startswith(f"1 {label} ")
    shard.write_text(f"1 {1 - label}" + "".join(lines)[3:])
    assert read_shards([shard], schema)[0][0] == label

    shard.write_text("".join(lines[:-1]))  # the text lost a row: its copy still has it
    assert len(read_shards([shard], schema)[0]) == len(lines) - 1

    shard.write_text("".join(lines))
    assert len(read_shards([shard], schema)[0]) == len(lines)
    piece = columns_dir(shard) / json.loads(recorded)["pieces"][0]
    piece.write_bytes(piece.read_bytes()[:100])  # a truncated piece
    _assert_same_rows(read_shards([shard], schema, with_weights=True),
                      read_shard_bytes(shard.read_bytes(), schema, str(shard)))


def test_parts_without_a_copy_make_a_shard_without_one(tmp_path):
    """Parts from before the copy existed (a step cache may hold them): the merge links no copy for their shards."""
    from components.data_prep.plan import plan_synthetic
    from components.data_prep.prepare import convert, merge

    plan = plan_synthetic(rows=2000, test_fraction=0.1, num_shards=2, vocab_size=1 << 16, seed=4)
    convert(plan, list(range(len(plan.units))), tmp_path / "parts", processes=1)
    for listed in (tmp_path / "parts").glob(f"unit-*/{COLUMN_PIECES}"):
        listed.unlink()
    stats = merge(plan, [tmp_path / "parts"], tmp_path / "out")
    schema = Schema.from_dict(stats["schema"])
    for shard in _shards(tmp_path / "out", stats):
        assert not columns_dir(shard).exists()
    assert sum(len(read_shards([s], schema)[0]) for s in _shards(tmp_path / "out", stats)) == 2000
