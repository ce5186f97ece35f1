"""Do hot ids overload a server? Per-server load of long-tailed ids, as Paddle routes them and as others would.

    python bench/hot_ids.py [--rows 400000] [--out bench/results/hot_ids.md]

For each generator (the default synthetic spec at Zipf exponents 1.05 to 1.4, and the Criteo-like generators of
``components.data_prep.synthetic.SPECS``), ``--rows`` rows are drawn and hashed into ids exactly as data prep does
(``category_id_tables``, ``table.vocab_size`` 2^20), then trained in batches of 256 per worker (2 workers). Per server:

* **rows**: distinct ids it holds (its memory and its save);
* **transfers**: the ids a batch pulls and pushes from it, each once per batch (Paddle merges an id's gradients in
  a push), summed over the pass: its bytes on the wire and its optimizer work
  (:func:`components.table.sharding.batch_row_pushes`).

The table gives the busiest server over the mean (1.00: even) for Paddle's routing, ``(id % shard_num) // ceil(shard_num
/ servers)``, at this project's ``shard_num`` (8 per server) and others (1 per server, 1,009: not a multiple), and
for a consistent-hash ring (160 virtual nodes per server over ``mix64(id)``), all from the same counts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import log, publish  # noqa: E402
from components.data_prep.hashing import mix64  # noqa: E402
from components.data_prep.synthetic import SPECS, SyntheticSpec, category_id_tables, generate  # noqa: E402
from components.table.sharding import batch_row_pushes, max_over_mean, rows_per_server  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "hot_ids.md"
VOCAB, BATCH, WORKERS, SERVERS = 1 << 20, 256, 2, (2, 4, 8)
VIRTUAL_NODES = 160


def generators() -> dict[str, SyntheticSpec]:
    zipf = {f"default, Zipf {s}": SyntheticSpec(zipf_exponent=s) for s in (1.05, 1.1, 1.2, 1.4)}
    return {**zipf, **{name: SPECS[name] for name in ("criteo_like", "long_tail")}}


def ring_owner(ids: np.ndarray, servers: int) -> np.ndarray:
    """Consistent hashing: the server owning the first virtual node at or after ``mix64(id)`` on the ring."""
    nodes = mix64(np.arange(servers * VIRTUAL_NODES, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15))
    owner = np.repeat(np.arange(servers), VIRTUAL_NODES)
    order = np.argsort(nodes)
    nodes, owner = nodes[order], owner[order]
    at = np.searchsorted(nodes, mix64(np.asarray(ids, dtype=np.uint64))) % len(nodes)
    return owner[at]


def load(ids: np.ndarray, rows: np.ndarray, servers: int, route) -> tuple[float, float]:
    """(rows, transfers) max/mean with ``route``: a shard count (Paddle) or "ring"."""
    per_worker = np.array_split(np.arange(len(ids)), WORKERS)
    if route == "ring":
        distinct = np.unique(ids)
        held = np.bincount(ring_owner(distinct, servers), minlength=servers).tolist()
        moved = np.zeros(servers, np.int64)
        for part in per_worker:
            batch = rows[part] // BATCH
            pairs = np.unique(np.stack([batch, ids[part].astype(np.int64)]), axis=1)
            moved += np.bincount(ring_owner(pairs[1], servers), minlength=servers)
        return max_over_mean(held), max_over_mean(moved.tolist())
    held = rows_per_server(np.unique(ids), route, servers)
    moved = np.zeros(servers, np.int64)
    for part in per_worker:
        moved += batch_row_pushes(ids[part], rows[part], BATCH, route, servers)
    return max_over_mean(held), max_over_mean(moved.tolist())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    lines = [f"# Per-server load of long-tailed ids ({time.strftime('%Y-%m-%d')})", "",
             f"`python bench/hot_ids.py --rows {args.rows}`: {args.rows:,} rows per generator, 26 sparse slots, "
             f"vocab 2^20, {WORKERS} workers in batches of {BATCH}. Busiest server / mean, rows held | ids pulled and "
             f"pushed (bytes). Paddle routes `(id % shard_num) // ceil(shard_num / servers)`; ring: consistent "
             f"hashing, {VIRTUAL_NODES} virtual nodes per server.", "",
             "| generator | top 1% of ids: share of sightings | servers | shard_num 8/server (ours) | 1/server | "
             "1,009 | ring |", "|---|---:|---:|---|---|---|---|"]
    for name, spec in generators().items():
        log(f"{name}: {args.rows:,} rows")
        data = generate(args.rows, seed=0, spec=spec)
        tables = category_id_tables(spec, VOCAB)
        ids = np.stack([tables[f][data.categories[:, f]] for f in range(len(tables))], axis=1)
        rows = np.repeat(np.arange(args.rows), ids.shape[1])
        ids = ids.reshape(-1)
        _, counts = np.unique(ids, return_counts=True)
        top = np.sort(counts)[::-1][: max(1, len(counts) // 100)].sum() / counts.sum()
        for servers in SERVERS:
            cells = [load(ids, rows, servers, route) for route in (8 * servers, servers, 1009, "ring")]
            lines.append(f"| {name} | {top:.0%} | {servers} | "
                         + " | ".join(f"{held:.3f} \\| {moved:.3f}" for held, moved in cells) + " |")
    publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
