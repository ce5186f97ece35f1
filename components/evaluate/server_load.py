"""The load each server carried in a run: the train split's ids as Paddle routed them, counted from the prepared data.

A server holds the rows of the ids routed to it (``(id % shard_num) // shards per server``:
:mod:`components.table.sharding`) and is sent, per batch, each of its distinct ids once, pulled and then pushed; a hot
id costs one row per batch, not one per sighting, so the skew of long-tailed ids shows in rows and row transfers per
server rather than in requests (every batch asks every server). Counted here on each train shard in batches of
``ps.batch_size``, as a worker thread reads it; train rows beyond the first :data:`COUNTED_ROWS` are left out (the
facts say how many were counted).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from components.config import CtrConfig
from components.data_prep.multislot import Schema, read_shards
from components.table.sharding import (batch_row_pushes, default_shard_num, distinct_ids, max_over_mean,
                                       rows_per_server)

# Train rows counted at most: the load's shape settles long before (the ids' frequencies are the data's), and the
# evaluate step reads no more of the train split than its baseline does.
COUNTED_ROWS = 2_000_000
FLOAT_BYTES, KEY_BYTES = 4, 8
LOAD_THREADS = min(2, len(os.sched_getaffinity(0)))  # the evaluate step's pod has 2 CPUs (cluster.steps.evaluate)


def row_transfer_bytes(embedding_dim: int) -> int:
    """Bytes one row costs a batch on the wire: its key asked and its ``dim`` floats answered (the pull), its key
    and ``dim + 3`` floats pushed (slot, show, click, the gradient)."""
    return KEY_BYTES + FLOAT_BYTES * embedding_dim + KEY_BYTES + FLOAT_BYTES * (embedding_dim + 3)


def train_ids(data_dir: str | Path, limit: int = COUNTED_ROWS) -> tuple[list[tuple[np.ndarray, np.ndarray]], int, int]:
    """Per train shard, ``(ids, row of each id)``; the rows counted and the train rows in all."""
    stats = json.loads((Path(data_dir) / "stats.json").read_text())
    schema = Schema.from_dict(stats["schema"])
    shards, counted = [], 0
    for path in stats["shards"]["train"]:
        if counted >= limit:
            break
        _, _, sparse = read_shards([Path(data_dir) / path], schema)
        rows = min(limit - counted, len(sparse[0].offsets) - 1) if sparse else 0
        ids = [slot.values[: slot.offsets[rows]] for slot in sparse]
        row_of = [np.repeat(np.arange(rows), np.diff(slot.offsets[: rows + 1])) for slot in sparse]
        shards.append((np.concatenate(ids) if ids else np.zeros(0, np.int64),
                       np.concatenate(row_of) if row_of else np.zeros(0, np.int64)))
        counted += rows
    return shards, counted, int(stats["rows"]["train"])


def server_load(cfg: CtrConfig, shards: list[tuple[np.ndarray, np.ndarray]], shard_num: int) -> dict:
    """``rows`` (distinct ids) and ``row_transfers`` (distinct ids per batch, summed) per server, and
    ``bytes`` per pass (:func:`row_transfer_bytes` each)."""
    servers = cfg.ps.servers
    # The split's distinct ids and each shard's distinct (batch, id) pairs are sorts of their own, which NumPy runs
    # without the GIL: side by side on the step's cores (the evaluate step on 800k rows with 1.3M distinct ids:
    # 3.9 -> 3.1 s).
    with ThreadPoolExecutor(LOAD_THREADS) as pool:
        distinct = (pool.submit(distinct_ids, np.concatenate([ids for ids, _ in shards])) if shards else None)
        pushes = [pool.submit(batch_row_pushes, ids, rows, cfg.ps.batch_size, shard_num, servers)
                  for ids, rows in shards]
        transfers = np.zeros(servers, np.int64)
        for counted in pushes:
            transfers += counted.result()
        distinct = distinct.result() if distinct is not None else np.zeros(0, np.int64)
    per_row = row_transfer_bytes(cfg.table.embedding_dim)
    return {"rows": rows_per_server(distinct, shard_num, servers), "row_transfers": transfers.tolist(),
            "bytes": (transfers * per_row).tolist(), "shard_num": shard_num}


def load_facts(cfg: CtrConfig, data_dir: str | Path, shard_num: int | None) -> dict[str, str]:
    """The "Servers" table's lines of the run's load: per server, and the busiest over the mean."""
    shard_num = shard_num or cfg.table.shard_num or default_shard_num(cfg.ps.servers)
    shards, counted, total = train_ids(data_dir)
    load = server_load(cfg, shards, shard_num)
    facts = {f"server {i} load": f"{rows:,} rows touched, {moved:,} rows pulled and pushed ({size / 1e6:,.1f} MB) "
                                 f"per pass" for i, (rows, moved, size) in
             enumerate(zip(load["rows"], load["row_transfers"], load["bytes"]))}
    sample = "every train row" if counted >= total else f"the first {counted:,} of {total:,} train rows"
    facts["load, busiest server / mean"] = (
        f"rows {max_over_mean(load['rows']):.3f}x, bytes {max_over_mean(load['bytes']):.3f}x ({sample}, batches of "
        f"{cfg.ps.batch_size}, ids routed as Paddle does: (id % {shard_num}) // shards per server)")
    return facts
