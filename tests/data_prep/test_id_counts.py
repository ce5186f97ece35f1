"""The counting pass and the count filter (data.min_id_count): a count-min sketch of the train ids in bounded
memory, rare ids written as their slot's OOV id, the counts the memory planner reads."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from components.checkpoint.days import ledger_at
from components.config import to_dict
from components.data_prep.id_counts import SKETCH_BYTES, CountSketch, oov_id
from components.data_prep.multislot import Schema, parse_line, read_shards
from components.data_prep.prepare import SKETCH_FILE, DataPrepError, prepare_files, prepare_synthetic
from components.data_prep.formats import raw_value_id
from components.data_prep.step import convert_units, merge_parts, plan_dataset, prepare_dataset
from tests.data_prep.inputs import dataset_files, write_inputs

VOCAB = 1 << 20
SPLITS = ("train", "valid", "test")


def _prepare(inputs: Path, out: Path, **settings) -> dict:
    return prepare_files(out, uri=f"{inputs}/part-*", fmt="raw", test_fraction=0.2, valid_fraction=0.1,
                         num_shards=3, vocab_size=VOCAB, seed=5, max_malformed_fraction=0.0, **settings)


def _ids(out: Path, stats: dict, split: str) -> list:
    """Per sparse slot, the split's ids (one per row: raw input)."""
    _, _, sparse = read_shards([out / p for p in stats["shards"][split]], Schema.from_dict(stats["schema"]))
    return [slot.values for slot in sparse]


def test_the_sketch_never_counts_low_and_adds_up_in_any_grouping():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 1 << 63, 50_000, dtype=np.uint64)
    counts = rng.integers(1, 5, len(keys))
    whole, first, second = CountSketch(), CountSketch(), CountSketch()
    whole.add(keys, counts)
    first.add(keys[::2], counts[::2])
    second.add(keys[1::2], counts[1::2])
    first.merge(second)
    assert np.array_equal(first.table, whole.table) and whole.counted == counts.sum()
    estimates = whole.estimates(keys)
    assert (estimates >= counts).all() and np.mean(estimates == counts) > 0.999
    assert whole.table.nbytes == SKETCH_BYTES == 64 << 20  # whatever the ids


def test_a_counter_stops_at_the_top_rather_than_wrap():
    key, top = np.array([7], np.uint64), (1 << 32) - 1
    sketch = CountSketch()
    sketch.add(key, [top - 1])
    sketch.add(key, [5])
    assert sketch.estimates(key)[0] == top
    other = CountSketch(sketch.table.copy())
    sketch.merge(other)
    assert sketch.estimates(key)[0] == top


def test_the_oov_id_is_reserved_per_slot_inside_the_vocabulary():
    ids = {slot: oov_id(slot, VOCAB) for slot in (f"C{i}" for i in range(1, 27))}
    assert len(set(ids.values())) == 26 and all(0 <= i < VOCAB for i in ids.values())
    assert oov_id("C3", 1000) < 1000


def test_the_count_filter_maps_exactly_the_rare_train_ids(tmp_path):
    """On a small dataset the sketch is exact: the filtered dataset is the plain one with every id seen in fewer
    than min_id_count train rows (never, for an id only validation or test rows hold) replaced by its slot's OOV id."""
    inputs, m = write_inputs(tmp_path / "in"), 3
    plain = _prepare(inputs, tmp_path / "plain", processes=1, unit_bytes=64 << 10)
    filtered = _prepare(inputs, tmp_path / "filtered", processes=2, unit_bytes=64 << 10, min_id_count=m)
    slots = plain["schema"]["sparse_slots"]
    train_counts = [Counter(ids.tolist()) for ids in _ids(tmp_path / "plain", plain, "train")]
    mapped_ids = {slot: set() for slot in slots}
    for split in SPLITS:
        before, after = _ids(tmp_path / "plain", plain, split), _ids(tmp_path / "filtered", filtered, split)
        holds_oov = np.zeros(plain["rows"][split], bool)
        for slot, counts, ids, written in zip(slots, train_counts, before, after):
            rare = np.array([counts[i] < m for i in ids.tolist()], bool)
            assert written.tolist() == np.where(rare, oov_id(slot, VOCAB), ids).tolist()
            mapped_ids[slot] |= set(ids[rare].tolist())
            holds_oov |= rare
        assert filtered["oov"]["rows"][split] == int(holds_oov.sum()) > 0
    assert filtered["min_id_count"] == m and plain["min_id_count"] == 1 and "oov" not in plain
    assert filtered["oov"]["ids"] == {slot: oov_id(slot, VOCAB) for slot in slots}
    assert filtered["oov"]["mapped_ids"] == {slot: len(ids) for slot, ids in mapped_ids.items()}
    assert filtered["oov"]["mapped_ids"]["C1"] == 0 < filtered["oov"]["mapped_ids"]["C26"]  # 41 values vs 1041
    # After the filter a slot's rare ids are one id: counted once.
    assert filtered["distinct_ids"] == {slot: len(set(ids.tolist()))
                                        for slot, ids in zip(slots, _ids(tmp_path / "filtered", filtered, "train"))}
    assert filtered["distinct_ids_seen_at_least"] == {
        str(k): sum(sum(1 for c in counts.values() if c >= k) for counts in train_counts)
        for k in (1, 2, 3, 5, 10, 20, 50, 100)}
    assert filtered["id_counts"]["sightings"] == plain["rows"]["train"] * len(slots)


def test_an_admission_threshold_counts_without_filtering(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    plain = _prepare(inputs, tmp_path / "plain", processes=1)
    counted = _prepare(inputs, tmp_path / "counted", processes=1, embedx_threshold=5.0)
    files = dataset_files(tmp_path / "counted")
    assert {rel: data for rel, data in files.items() if rel != "stats.json"} == {
        rel: data for rel, data in dataset_files(tmp_path / "plain").items() if rel != "stats.json"}
    assert "oov" not in counted and counted["distinct_ids_seen_at_least"]["1"] == sum(plain["distinct_ids"].values())
    assert counted["distinct_ids_seen_at_least"]["5"] < counted["distinct_ids_seen_at_least"]["2"]
    assert "distinct_ids_seen_at_least" not in plain


def test_an_id_twice_in_one_row_counts_once(tmp_path):
    # Ordered split without validation: the first 80% of the bytes are train rows, the filler after them test rows.
    lines = ["1:1 5:2 5:2 9:3", "0:1 6:2 9:3", "0:1 6:2 9:3", *["0:1 7:2 9:3"] * 40]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    stats = prepare_files(tmp_path / "out", uri=str(tmp_path / "in.txt"), fmt="feasign", test_fraction=0.2,
                          num_shards=1, vocab_size=VOCAB, seed=0, max_malformed_fraction=0.0, split="ordered",
                          min_id_count=2)
    schema = Schema.from_dict(stats["schema"])
    train = (tmp_path / "out" / "train" / "part-00000.txt").read_text().splitlines()
    rows = [parse_line(line, schema) for line in train]
    assert rows[0].sparse[0] == [oov_id("2", VOCAB)] * 2  # feasign 5: twice, in one row
    assert rows[1].sparse[0] == rows[2].sparse[0] == [raw_value_id("2", "6", VOCAB)]  # feasign 6: in two rows
    seen = stats["distinct_ids_seen_at_least"]
    assert (seen["1"], seen["2"], seen["3"]) == (4, 3, 2)  # 5, 6, 7 of slot 2 and 9 of slot 3
    assert stats["oov"]["mapped_ids"] == {"2": 1, "3": 0} and stats["oov"]["rows"]["train"] == 1


def test_synthetic_rows_are_filtered_alike(tmp_path):
    settings = dict(rows=20_000, test_fraction=0.25, valid_fraction=0.1, num_shards=2, vocab_size=VOCAB, seed=0)
    plain = prepare_synthetic(tmp_path / "plain", **settings)
    filtered = prepare_synthetic(tmp_path / "filtered", **settings, min_id_count=5, negative_sample_rate=0.5)
    kept_train = prepare_synthetic(tmp_path / "sampled", **settings, negative_sample_rate=0.5)
    slots = plain["schema"]["sparse_slots"]
    counts = [Counter(ids.tolist()) for ids in _ids(tmp_path / "sampled", kept_train, "train")]
    for split in SPLITS:
        before, after = _ids(tmp_path / "sampled", kept_train, split), _ids(tmp_path / "filtered", filtered, split)
        for slot, count, ids, written in zip(slots, counts, before, after):
            assert written.tolist() == [oov_id(slot, VOCAB) if count[i] < 5 else i for i in ids.tolist()]
    assert filtered["oov"]["mapped_ids"]["C9"] == 0 < filtered["oov"]["mapped_ids"]["C10"]  # 3 vs 40,000 values
    assert filtered["bayes"] == plain["bayes"]


def test_the_dataset_is_the_same_whatever_prep_parallelism_and_prep_processes(tmp_path, config):
    """Each convert task counts the whole input (listed again), so the groups map ids alike."""
    inputs = write_inputs(tmp_path / "in")
    cfg = to_dict(config("data=criteo", f"data.uri={inputs}/part-*", "data.prep_parallelism=3",
                         "data.prep_processes=1", "data.min_id_count=2", "data.negative_sample_rate=0.5",
                         "table.admission.embedx_threshold=3"))
    groups = plan_dataset(cfg)
    assert len(groups) > 1 and groups[0]["plan"]["count_ids"]  # a group holds only its own units
    parts = [tmp_path / f"parts-{i}" for i in range(len(groups))]
    for group, part in zip(groups, parts):
        convert_units(group, str(part))
    # The count filter's sketch is the transform's: one task keeps its copy for the merge (64 MiB, not one per task).
    assert [p.name for p in parts if (p / SKETCH_FILE).is_file()] == ["parts-0"]
    merge_parts(groups, [str(p) for p in parts], str(tmp_path / "fanned"), ledger_at)
    one = prepare_dataset(cfg, str(tmp_path / "one"), ledger_at, processes=2)
    assert dataset_files(tmp_path / "fanned") == dataset_files(tmp_path / "one")
    assert "transform/id_counts.npy" in dataset_files(tmp_path / "fanned")
    assert one["min_id_count"] == 2 and one["negative_sample_rate"] == 0.5 and one["oov"]["rows"]["train"] > 0


def test_a_convert_task_refuses_an_input_changed_since_the_plan(tmp_path, config):
    inputs = write_inputs(tmp_path / "in", lines=300)
    cfg = to_dict(config("data=criteo", f"data.uri={inputs}/part-*", "data.min_id_count=2"))
    (group,) = plan_dataset(cfg)
    (inputs / "part-d.tsv").write_text((inputs / "part-b.tsv").read_text())
    with pytest.raises(DataPrepError, match="changed since data prep planned it") as err:
        convert_units(group, str(tmp_path / "parts"))
    assert "\n" not in str(err.value)


def test_min_id_count_below_one_is_refused(tmp_path):
    with pytest.raises(DataPrepError, match="min_id_count must be >= 1"):
        _prepare(write_inputs(tmp_path / "in", lines=30), tmp_path / "out", min_id_count=0)
