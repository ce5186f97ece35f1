"""Where rows live and what a batch sends each server (components.table.sharding)."""

import numpy as np
import pytest

from components.table.sharding import batch_row_pushes, server_of


def _pushes_by_hand(ids: np.ndarray, rows: np.ndarray, batch: int, shard_num: int, servers: int) -> list[int]:
    sent = [0] * servers
    for b in np.unique(rows // batch):
        for feature in set(ids[rows // batch == b].tolist()):
            sent[int(server_of(np.array([feature]), shard_num, servers)[0])] += 1
    return sent


@pytest.mark.parametrize("high_bit", [20, 62], ids=["one-sort", "pair-sort"])
def test_batch_row_pushes_counts_each_batchs_distinct_ids_per_server(high_bit):
    """Ids and batch numbers that fit one 64-bit key take one sort; ids of 62 bits with 40 batches do not."""
    rng = np.random.default_rng(7)
    pool = rng.integers(0, 1 << high_bit, 300, dtype=np.uint64) | np.uint64(1 << (high_bit - 1))
    rows = np.repeat(np.arange(400), 3)
    ids = rng.choice(pool, len(rows))  # repeats within and across batches
    pushes = batch_row_pushes(ids, rows, 10, 16, 3)
    assert pushes == _pushes_by_hand(ids, rows, 10, 16, 3)
    assert sum(pushes) < len(ids)  # a repeated id in a batch is sent once


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_distinct_ids_are_numpys_unique(dtype):
    from components.table.sharding import distinct_ids

    rng = np.random.default_rng(5)
    ids = rng.integers(0, 1 << 40, 50_000).astype(dtype)
    ids[::3] = ids[::3] % 97  # many repeats
    assert distinct_ids(ids).dtype == dtype
    np.testing.assert_array_equal(distinct_ids(ids), np.unique(ids))
    assert distinct_ids(np.zeros(0, dtype)).size == 0
