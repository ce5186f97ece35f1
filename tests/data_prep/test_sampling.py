"""Negative downsampling (data.negative_sample_rate): the train split keeps a share of its negatives, chosen by a
hash of where each row is; every positive and every validation and test row stays."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from components.data_prep.prepare import DataPrepError, prepare_files, prepare_synthetic
from tests.data_prep.inputs import dataset_files, split_lines, write_inputs

RATE = 0.3


def _prepare(inputs: Path, out: Path, **settings) -> dict:
    return prepare_files(out, uri=f"{inputs}/part-*", fmt="raw", test_fraction=0.2, valid_fraction=0.1,
                         num_shards=3, vocab_size=1 << 20, seed=5, max_malformed_fraction=0.0, **settings)


def _negatives(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("1 0 ")]


def _positives(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("1 1 ")]


def test_the_train_split_keeps_a_share_of_its_negatives_and_every_other_row(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    full = _prepare(inputs, tmp_path / "full", processes=1)
    sampled = _prepare(inputs, tmp_path / "sampled", processes=1, negative_sample_rate=RATE)
    for split in ("valid", "test"):
        assert split_lines(tmp_path / "sampled", sampled, split) == split_lines(tmp_path / "full", full, split)
    before, after = (sorted(split_lines(tmp_path / name, stats, "train"))
                     for name, stats in (("full", full), ("sampled", sampled)))
    assert _positives(after) == _positives(before)
    kept, negatives = Counter(_negatives(after)), Counter(_negatives(before))
    assert kept <= negatives  # a subset: rows are left out, never changed
    assert abs(sum(kept.values()) / sum(negatives.values()) - RATE) < 0.04
    assert sampled["negative_sample_rate"] == RATE and full["negative_sample_rate"] == 1.0
    assert sampled["negative_sampling"] == {
        "train_rows_before": full["rows"]["train"], "train_rows_after": len(after),
        "train_clicks_before": len(_positives(before)), "train_clicks_after": len(_positives(before))}
    assert sampled["ctr"]["train"] > full["ctr"]["train"] and sampled["ctr"]["test"] == full["ctr"]["test"]
    assert sampled["prep"]["fingerprint"] != full["prep"]["fingerprint"]


def test_the_sample_is_the_same_whatever_the_processes_and_the_cut(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    one = _prepare(inputs, tmp_path / "one", processes=1, negative_sample_rate=RATE, unit_bytes=64 << 10)
    two = _prepare(inputs, tmp_path / "two", processes=2, negative_sample_rate=RATE, unit_bytes=64 << 10)
    assert dataset_files(tmp_path / "one") == dataset_files(tmp_path / "two") and one == two
    whole = _prepare(inputs, tmp_path / "whole", processes=1, negative_sample_rate=RATE)
    assert two["prep"]["units"] > whole["prep"]["units"]
    # Rows are dealt to shards per unit, so the shards differ with the cut: the rows of each split do not.
    for split in ("train", "valid", "test"):
        rows = [sorted(split_lines(tmp_path / name, stats, split)) for name, stats in (("whole", whole), ("two", two))]
        assert rows[0] == rows[1]


def test_synthetic_rows_are_downsampled_alike(tmp_path):
    settings = dict(rows=20_000, test_fraction=0.25, valid_fraction=0.1, num_shards=2, vocab_size=1 << 20, seed=0)
    full = prepare_synthetic(tmp_path / "full", **settings)
    sampled = prepare_synthetic(tmp_path / "sampled", **settings, negative_sample_rate=0.5)
    for split in ("valid", "test"):
        assert split_lines(tmp_path / "sampled", sampled, split) == split_lines(tmp_path / "full", full, split)
    assert sampled["bayes"] == full["bayes"]  # scored on the same test rows
    before, after = (sorted(split_lines(tmp_path / name, stats, "train"))
                     for name, stats in (("full", full), ("sampled", sampled)))
    assert _positives(after) == _positives(before) and Counter(_negatives(after)) <= Counter(_negatives(before))
    assert abs(len(_negatives(after)) / len(_negatives(before)) - 0.5) < 0.03
    assert sampled["negative_sampling"]["train_rows_after"] == len(after) == sampled["rows"]["train"]


@pytest.mark.parametrize("rate", [0.0, 1.5])
def test_a_rate_outside_0_to_1_is_refused(tmp_path, rate):
    with pytest.raises(DataPrepError, match=r"negative_sample_rate must be in \(0, 1\]"):
        _prepare(write_inputs(tmp_path / "in", lines=30), tmp_path / "out", negative_sample_rate=rate)
