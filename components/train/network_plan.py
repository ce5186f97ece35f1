"""The network plan: the bytes a PS job's workers and servers exchange, per example, per second and per server.

A model of what Paddle 2.6.2's brpc PS client sends, checked against the servers' own connection counters
(``bench/wire.py``; bench/results/network.md). For a batch of ``B`` examples holding ``U(B)`` distinct ids, a worker
in ``async`` or ``sync`` mode

* pulls the dense parameters (4 B each) and the ``U(B)`` rows it looks up (4 B x ``dim`` each), asking with their
  keys (8 B each);
* pushes the dense gradient (4 B a parameter), and per distinct id its key and ``dim + 3`` floats (slot, show,
  click, the gradient), once per ``ps.batches_per_push`` batches: the client sums ``k`` batches' dense gradients
  into one push and merges their sparse pushes (the distinct ids of ``k`` batches, ``U(kB)``).

A ``geo`` worker trains on a local copy: when it starts it exchanges the whole table with the servers (its keys
and rows up, the rows back: ``vocab_size x dim`` rows, whatever the data), then every ``ps.geo_k_steps`` batches
the dense parameters' delta and the touched rows' deltas, both ways. That start is measured (0.91x the model on
a 2 x 2 job); the steady exchange is not modelled as well: Paddle's geo communicator sent 1.5-3x the deltas' bytes
(bench/results/network.md), so a geo line's bytes per example are a floor.

``U(B)`` is counted on the synthetic generator's rows (the dataset's own generator and seed when ``stats.json``
names them): with skewed ids a batch repeats many (26 x 256 ids held 2,039 distinct ones on the default data). Files
are not read before data prep: every id of a batch is taken as distinct, an upper bound.

Dense parameters split evenly over the servers (Paddle cuts each dense table into ``servers`` equal parts) and
hashed ids spread evenly (:mod:`components.table.sharding`), so each server carries ``1 / servers`` of the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from components.config import CtrConfig, DataSource, Mode
from components.networks.models import dense_parameters
from components.train.process_plan import DataShape

FLOAT_BYTES, KEY_BYTES = 4, 8
# Examples per second a worker trains at, for the per-second figures: this machine's measured async rate with every
# batch its own push (2 servers + 2 workers on 2 cores: 29,800-31,100 examples/s, issue 36; bench/throughput.py).
PLANNED_EXAMPLES_PER_S_PER_WORKER = 15_000
# Batches of the generator's rows counted for U(B): the mean over this many is within 1% of the next ones.
SAMPLED_BATCHES = 8


@dataclass(frozen=True)
class NetworkPlan:
    mode: Mode
    to_servers: float  # bytes per trained example, all servers together
    to_workers: float
    servers: int
    workers: int
    start_bytes_per_worker: int  # geo: the table exchanged once when a worker starts (both ways)
    distinct_ids: str  # how U(B) was found

    @property
    def per_example(self) -> float:
        return self.to_servers + self.to_workers

    @property
    def rate(self) -> int:
        return PLANNED_EXAMPLES_PER_S_PER_WORKER * self.workers

    def per_server_per_s(self) -> float:
        return self.per_example * self.rate / self.servers

    def line(self) -> str:
        server = self.per_server_per_s()
        start = (f"; geo: {self.start_bytes_per_worker / 1e6:,.0f} MB per worker when it starts (the whole table)"
                 if self.start_bytes_per_worker else "")
        floor = "at least " if self.mode is Mode.geo else ""
        return (f"network plan: {self.mode.value}: {floor}{self.per_example:,.0f} B per example ({self.to_servers:,.0f} to "
                f"the servers, {self.to_workers:,.0f} back) = {self.per_example * self.rate / 1e6:,.0f} MB/s at "
                f"{self.rate:,} examples/s ({PLANNED_EXAMPLES_PER_S_PER_WORKER:,} per worker, this machine's measured "
                f"rate); per server {server / 1e6:,.1f} MB/s ({server * 8 / 1e6:,.0f} Mbit/s){start}; distinct ids per "
                f"batch {self.distinct_ids}")

    def summary(self) -> dict:
        return {"bytes_per_example": round(self.per_example), "to_servers": round(self.to_servers),
                "to_workers": round(self.to_workers), "per_server_bytes_per_s": round(self.per_server_per_s()),
                "examples_per_s": self.rate, "start_bytes_per_worker": self.start_bytes_per_worker}


def distinct_ids_per_batch(cfg: CtrConfig, data: DataShape, stats: Optional[dict],
                           sizes: tuple[int, ...]) -> tuple[list[float], str]:
    """The mean distinct ids of a batch of each of ``sizes`` examples, and how they were found."""
    from components.data_prep.synthetic import SyntheticSpec, generate

    generator = (stats or {}).get("generator")
    if generator:
        spec, seed = SyntheticSpec(**{**generator, "cardinalities": tuple(generator["cardinalities"])}), stats["seed"]
    elif stats is None and cfg.data.source is DataSource.synthetic:
        spec, seed = SyntheticSpec(), cfg.data.seed
    else:
        return ([float(size * data.ids_per_example) for size in sizes],
                f"taken as {data.ids_per_example} x the batch (every id distinct: an upper bound; files are not "
                f"read before data prep)")
    categories = generate(SAMPLED_BATCHES * max(sizes), seed, spec).categories
    # One key per (field, category): the hashed ids of two fields differ.
    keys = categories + np.arange(categories.shape[1]) * (int(categories.max()) + 1)
    found = [float(np.mean([len(np.unique(keys[i:i + size])) for i in range(0, SAMPLED_BATCHES * size, size)]))
             for size in sizes]
    return found, f"counted on {SAMPLED_BATCHES} batches of the synthetic generator's rows ({found[0]:,.0f} of " \
                  f"{data.ids_per_example * sizes[0]:,} at {sizes[0]})"


def plan_network(cfg: CtrConfig, data: DataShape, stats: Optional[dict] = None) -> NetworkPlan:
    """The bytes ``cfg``'s job exchanges per trained example (the module's model)."""
    ps, dim = cfg.ps, cfg.table.embedding_dim
    dense = dense_parameters(cfg.model, data.sparse_slots, data.dense_dim, dim) * FLOAT_BYTES
    batch = ps.batch_size
    merged = batch * (ps.geo_k_steps if ps.mode is Mode.geo else ps.batches_per_push)
    (per_batch, per_merge), how = distinct_ids_per_batch(cfg, data, stats, (batch, merged))
    row_up, row_down = KEY_BYTES + FLOAT_BYTES * (dim + 3), FLOAT_BYTES * dim
    if ps.mode is Mode.geo:
        rows = cfg.table.vocab_size
        start = rows * (KEY_BYTES + FLOAT_BYTES * dim) + rows * FLOAT_BYTES * dim
        up = (dense + per_merge * (KEY_BYTES + FLOAT_BYTES * dim)) / merged
        down = (dense + per_merge * row_down) / merged
        return NetworkPlan(ps.mode, up, down, ps.servers, ps.workers, start, how)
    up = dense / merged + per_merge * row_up / merged + per_batch * KEY_BYTES / batch
    down = dense / batch + per_batch * row_down / batch
    return NetworkPlan(ps.mode, up, down, ps.servers, ps.workers, 0, how)
