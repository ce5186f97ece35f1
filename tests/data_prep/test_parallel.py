"""Data prep at scale: stable ids, units that own each line once, output independent of the number of processes,
bounded distinct counting, streamed S3 input."""

from __future__ import annotations

import filecmp
import gzip
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from components.data_prep.distinct import EXACT_LIMIT, RELATIVE_ERROR, DistinctCounter
from components.data_prep.hashing import (HASH_FUNCTION, check_hash_function, feature_id, feature_key,
                                          hash64, hash_arrow_values, slot_prefix)
from components.data_prep.prepare import DataPrepError, prepare_files
from components.data_prep.sources import Unit, group_units, list_inputs, plan_units, read_blocks
from tests.data_prep.inputs import raw_line


def test_golden_ids_never_change():
    """The ids of fixed raw values, recorded once: a change here breaks every trained model's ids."""
    assert HASH_FUNCTION == "fnv1a64+fmix64(slot\\x1fvalue) mod vocab_size"
    cases = [("C1", "05db9164", 1 << 20, 204543), ("C26", "", 1 << 20, 378305), ("C7", "<missing>", 1000003, 373032),
             ("2", "12345678901234567890", 1 << 24, 195804), ("C14", "b28479f6", 1 << 53, 2775176894489856)]
    for slot, value, vocab, expected in cases:
        assert feature_id(slot, value, vocab) == expected
        vectorised = hash_arrow_values(slot_prefix(slot), pa.array([value], pa.binary()))
        assert int(vectorised[0]) == hash64(feature_key(slot, value)) and int(vectorised[0]) % vocab == expected


def test_ids_from_an_unknown_hash_function_are_refused():
    check_hash_function(HASH_FUNCTION, "stats.json")
    check_hash_function(None, "a model made before names were recorded")  # the same function
    with pytest.raises(ValueError, match="'murmur3', which this code does not implement"):
        check_hash_function("murmur3", "serving.json")


def _write_inputs(root: Path, lines: int = 3000) -> Path:
    """Two plain files (one with malformed and blank lines, one without a final newline) and a gzip file."""
    rng = random.Random(7)
    root.mkdir(parents=True)
    rows = [raw_line(rng, 50) for _ in range(lines)]
    rows[10], rows[1500], rows[2990] = "1\t2\t3", "", "x" + rows[2990]  # wrong width, blank, bad label
    (root / "part-a.tsv").write_text("\n".join(rows) + "\n")
    (root / "part-b.tsv").write_text("\n".join(raw_line(rng, 50) for _ in range(lines // 2)))
    with gzip.open(root / "part-c.tsv.gz", "wt") as f:
        f.write("\n".join(raw_line(rng, 50) for _ in range(lines // 3)) + "\n")
    return root


def _prepare(inputs: Path, out: Path, **settings) -> dict:
    return prepare_files(out, uri=f"{inputs}/part-*", fmt="raw", test_fraction=0.2, num_shards=3,
                         vocab_size=1 << 20, seed=5, max_malformed_fraction=0.01, **settings)


def _files(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def test_the_dataset_is_the_same_byte_for_byte_whatever_the_number_of_processes(tmp_path):
    inputs = _write_inputs(tmp_path / "in")
    single = _prepare(inputs, tmp_path / "one", processes=1, unit_bytes=64 << 10)
    parallel = _prepare(inputs, tmp_path / "two", processes=2, unit_bytes=64 << 10)
    assert single["prep"]["units"] >= 6  # the first file alone is cut into several units
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    for rel in _files(tmp_path / "one"):
        assert filecmp.cmp(tmp_path / "one" / rel, tmp_path / "two" / rel, shallow=False), rel
    assert single == parallel
    lines = 3000 + 1500 + 1000
    assert single["rows"]["train"] + single["rows"]["test"] + single["malformed"]["count"] == lines - 1  # 1 blank
    # Shards are dealt round-robin per unit: they differ by at most one row per unit.
    for split in ("train", "test"):
        assert max(single["shard_rows"][split]) - min(single["shard_rows"][split]) <= single["prep"]["units"]


def test_malformed_lines_are_numbered_in_their_file_across_units(tmp_path):
    inputs = _write_inputs(tmp_path / "in")
    stats = _prepare(inputs, tmp_path / "out", processes=2, unit_bytes=64 << 10)
    where = [(Path(e["file"]).name, e["line"]) for e in stats["malformed"]["examples"]]
    assert where == [("part-a.tsv", 11), ("part-a.tsv", 2991)]
    assert "found 3" in stats["malformed"]["examples"][0]["reason"]


def test_the_test_split_does_not_depend_on_how_the_input_is_cut(tmp_path):
    """A row's split comes from (seed, file, byte offset of its line): any unit size gives the same test rows."""
    inputs = _write_inputs(tmp_path / "in")

    def test_rows(unit_bytes: int) -> list[str]:
        out = tmp_path / f"cut-{unit_bytes}"
        _prepare(inputs, out, processes=1, unit_bytes=unit_bytes)
        return sorted(line for p in sorted((out / "test").iterdir()) for line in p.read_text().splitlines())

    assert test_rows(16 << 10) == test_rows(1 << 30)


def test_units_own_every_line_exactly_once(tmp_path):
    text = "".join(f"line {i} {'x' * (i % 97)}\n" for i in range(2000)) + "last line without newline"
    (tmp_path / "f.txt").write_text(text)
    files = list_inputs(str(tmp_path / "f.txt"))
    for unit_bytes in (1, 100, 4096, 1 << 20):
        units = plan_units(files, unit_bytes)
        blocks = [(offset, block) for unit in units for offset, block in read_blocks(unit, read_bytes=777)]
        assert b"".join(block for _, block in blocks).decode() == text
        assert all(text.encode()[offset:offset + len(block)] == block for offset, block in blocks)
        assert all(block.endswith(b"\n") for _, block in blocks[:-1])
    groups = group_units(plan_units(files, 4096), 3)
    assert len(groups) == 3 and sum(groups, []) == list(range(len(plan_units(files, 4096))))


def test_a_compressed_file_is_one_unit_read_through_its_decompressor(tmp_path):
    with gzip.open(tmp_path / "f.tsv.gz", "wt") as f:
        f.write("a\nb\n")
    (unit,) = plan_units(list_inputs(str(tmp_path / "f.tsv.gz")), unit_bytes=1)
    assert unit.compressed and [block for _, block in read_blocks(unit)] == [b"a\nb\n"]
    assert Unit.from_dict(json.loads(json.dumps(unit.to_dict()))) == unit


def test_distinct_ids_are_exact_while_small_and_a_sketch_beyond():
    small = DistinctCounter()
    small.add(np.array([1, 2, 2, 3], np.uint64))
    small.add(np.array([3, 4], np.uint64))
    assert small.is_exact and small.count() == 4
    rng = np.random.default_rng(0)
    ids = np.unique(rng.integers(0, 1 << 40, 400_000).astype(np.uint64))
    halves = [DistinctCounter(), DistinctCounter()]
    for counter, part in zip(halves, np.array_split(ids, 2)):
        for chunk in np.array_split(part, 7):
            counter.add(chunk)
    merged = DistinctCounter.from_bytes(halves[0].to_bytes())
    merged.merge(DistinctCounter.from_bytes(halves[1].to_bytes()))
    assert not merged.is_exact and len(ids) > EXACT_LIMIT
    assert abs(merged.count() / len(ids) - 1) < 4 * RELATIVE_ERROR
    # Memory stays bounded: the sketch is 2^14 one-byte registers whatever the ids.
    assert merged.registers.nbytes == 1 << 14


def test_an_input_on_s3_is_streamed_and_gives_the_local_dataset(tmp_path, s3_endpoint):
    import fsspec

    inputs = _write_inputs(tmp_path / "in")
    remote = f"{s3_endpoint}/input"
    fs = fsspec.filesystem("s3")
    for path in sorted(inputs.iterdir()):
        fs.put_file(str(path), f"{remote}/{path.name}")
    local = _prepare(inputs, tmp_path / "local", processes=1, unit_bytes=64 << 10)
    streamed = prepare_files(tmp_path / "remote", uri=f"{remote}/part-*", fmt="raw", test_fraction=0.2, num_shards=3,
                             vocab_size=1 << 20, seed=5, max_malformed_fraction=0.01, processes=2,
                             unit_bytes=64 << 10)
    assert streamed["rows"] == local["rows"] and streamed["distinct_ids"] == local["distinct_ids"]
    for rel in _files(tmp_path / "local"):
        if rel != "stats.json":
            assert filecmp.cmp(tmp_path / "local" / rel, tmp_path / "remote" / rel, shallow=False), rel
    assert [e["file"] for e in streamed["malformed"]["examples"]][0].startswith("s3://")


def test_a_missing_unit_fails_the_merge(tmp_path):
    from components.data_prep.prepare import convert, merge, plan_files

    inputs = _write_inputs(tmp_path / "in")
    plan = plan_files(uri=f"{inputs}/part-*", fmt="raw", test_fraction=0.2, num_shards=3, vocab_size=1 << 20,
                      seed=5, max_malformed_fraction=0.01, unit_bytes=64 << 10)
    convert(plan, range(1, len(plan.units)), tmp_path / "parts", processes=1)
    with pytest.raises(DataPrepError, match=r"units \[0\] .* were not converted"):
        merge(plan, [tmp_path / "parts"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_counts_parsed_as_integers_give_the_text_the_per_value_path_gives():
    """A block of integer counts is parsed typed; one bad count sends the block through text parsing: the rows
    both read must come out the same."""
    from components.data_prep.formats import BlockParser, normalize_count, schema_for

    rng = random.Random(3)
    good = "".join(raw_line(rng, 50) + "\n" for _ in range(200)) + "1\t70000\t-2" + "\t" * 11 + "\tab" * 26 + "\n"
    parser = BlockParser("raw", schema_for("raw", None), 1 << 20)
    typed = parser.parse(good.encode())
    mixed = parser.parse((good + "0\tabc" + "\t1" * 12 + "\tcd" * 26 + "\n").encode())
    assert mixed.malformed == [(201, "I1 is not a finite number: 'abc'")] and not typed.malformed
    assert typed.text.to_pylist() == mixed.text.to_pylist()
    # A count beyond the cached table's, then a negative one (as 0); the float32's shortest text.
    large = np.format_float_positional(np.float32(normalize_count(70000)))
    assert typed.text.to_pylist()[-1].startswith(f"1 1 13 {large} 0 0 ")


def test_the_validation_split_is_cut_beside_the_test_split_without_moving_it(tmp_path):
    inputs = _write_inputs(tmp_path / "in")
    without = _prepare(inputs, tmp_path / "without", processes=1)
    with_valid = _prepare(inputs, tmp_path / "with", processes=1, valid_fraction=0.15)

    def lines(out: Path, split: str) -> list[str]:
        return sorted(line for p in sorted((out / split).iterdir()) for line in p.read_text().splitlines())

    assert lines(tmp_path / "with", "test") == lines(tmp_path / "without", "test")  # the test rows stay put
    valid, train = lines(tmp_path / "with", "valid"), lines(tmp_path / "with", "train")
    assert not set(valid) & set(train) and sorted(valid + train) == lines(tmp_path / "without", "train")
    total = sum(with_valid["rows"].values())
    assert abs(with_valid["rows"]["valid"] / total - 0.15) < 0.03 and without["rows"]["valid"] == 0
    assert with_valid["valid_fraction"] == 0.15 and with_valid["ctr"]["valid"] > 0
