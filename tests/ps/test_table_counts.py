"""What small real PS jobs leave in the servers' saved table: each id's shows and clicks as its rows pushed them, and
the embedding factors only of the ids the admission threshold let in."""

import json

import numpy as np
import pytest

from components.checkpoint import format as ckpt_io
from components.checkpoint.store import CheckpointStore
from components.config import from_dict
from components.data_prep.multislot import Schema, read_shards
from components.data_prep.prepare import prepare_synthetic
from components.table.accessor import read_sparse_table
from components.train.step import launch_ps_job

ROWS = 4_000  # one pass over a few thousand rows: ids seen once, a few times and often


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return root, prepare_synthetic(root, rows=ROWS, test_fraction=0.1, num_shards=1, vocab_size=1 << 20, seed=5)


def _train(tmp_path, data_dir, table=None):
    """One pass of one server and one worker; the committed checkpoint's saved table directory."""
    cfg = from_dict({"ps": {"servers": 1, "workers": 1, "epochs": 1, "batch_size": 64},
                     "model": {"hidden": [16]}, "table": {"shard_num": 2, **(table or {})},
                     "checkpoint": {"uri": str(tmp_path / "ckpt")}, "run_dir": str(tmp_path)})
    result = launch_ps_job(cfg, data_dir, tmp_path / "logs", echo=lambda line: None)
    local = CheckpointStore(cfg.checkpoint.uri).download(result.checkpoints[-1]["id"], tmp_path / "checkpoint")
    return cfg, local / json.loads((local / ckpt_io.MODEL_META).read_text())["sparse_table"]


def _saved_counts(table_dir):
    """``{id: (show, click)}`` from the saved lines ``key slot unseen delta show click ...``."""
    counts = {}
    for part in sorted(table_dir.glob("part-*")):
        for line in part.read_text().splitlines():
            key, _, _, _, show, click = line.split()[:6]
            counts[int(key)] = (float(show), float(click))
    return counts


def _train_counts(data_dir, stats):
    """``(ids, occurrences, clicks)`` of every id in the train shards, by brute force over their rows."""
    schema = Schema.from_dict(stats["schema"])
    labels, _, sparse = read_shards([data_dir / rel for rel in stats["shards"]["train"]], schema)
    ids = np.concatenate([slot.values for slot in sparse]).astype(np.uint64)
    row_of = np.concatenate([np.repeat(np.arange(len(labels)), np.diff(slot.offsets)) for slot in sparse])
    unique, inverse = np.unique(ids, return_inverse=True)
    return unique, np.bincount(inverse), np.bincount(inverse, weights=labels[row_of])


def test_saved_rows_count_each_ids_impressions_and_clicks(tmp_path, dataset):
    data_dir, stats = dataset
    _, table_dir = _train(tmp_path, data_dir)
    saved = _saved_counts(table_dir)
    ids, shows, clicks = _train_counts(data_dir, stats)
    assert sorted(saved) == ids.tolist()
    assert np.array_equal([saved[i][0] for i in ids.tolist()], shows)
    assert np.array_equal([saved[i][1] for i in ids.tolist()], clicks)
    assert clicks.sum() > 0 and (shows > 1).any()  # the premise: clicks to count, ids seen more than once


def test_ids_below_the_admission_threshold_keep_no_embedding_factors(tmp_path, dataset):
    data_dir, stats = dataset
    cfg, table_dir = _train(tmp_path, data_dir, table={"admission": {"embedx_threshold": 3}})
    ids, shows, _ = _train_counts(data_dir, stats)
    saved_ids, rows = read_sparse_table(table_dir, cfg.table.rule, cfg.table.embedding_dim)
    assert np.array_equal(saved_ids, ids)
    factors_set = (rows[:, 1:] != 0).any(axis=1)
    # Default coefficients: a row's score is its shows, so it gets its factors at its third.
    assert not factors_set[shows < 3].any()
    assert factors_set[shows >= 3].all()
    assert (shows < 3).any() and (shows >= 3).any()  # the premise: ids on both sides
    assert (rows[:, 0] != 0).all()  # every id trained its first-order weight
