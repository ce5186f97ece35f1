"""Server memory per embedding row: measured RSS vs. the planner's estimate vs. the bare fp32 payload, in one run;
and how evenly the default ``shard_num`` spreads Zipf-skewed ids over the servers.

    python bench/memory.py [--quick] [--work DIR] [--out bench/results/memory.md]

What runs (real local PS jobs through ``components.train.step.launch_ps_job``, one at a time; 2 servers,
2 workers, batch 256, one pass, adagrad, a DNN with one hidden layer of 16):

* **bytes per row**: for each table (``MemorySparseTable`` at dim 9 and 33, ``SSDSparseTable`` at dim 9), two
  jobs on synthetic data of 100k rows whose 26 slots draw ids *uniformly* from 10,000 ("small", ~260k
  distinct ids) or 150,000 ("large", ~1.8M distinct ids) categories per slot. Both jobs push the same number
  of keys per batch (nearly every key of a batch is distinct either way), so what differs between them is the
  rows the servers hold. The launcher samples each server's VmRSS every 0.2 s (``JobResult.server_memory``):
  *growth* = peak RSS - RSS when the server started serving (its table empty). Rows per server are counted
  from the checkpoint (``@checkpoint`` event: the export's ids routed with ``components.table.sharding.server_of``).

  - **measured B/row** = (growth_large - growth_small) / (rows_large - rows_small), per server, averaged over
    the servers: the slope, free of what does not scale with rows (RPC buffers, arenas);
  - **fixed growth** = growth_small - rows_small x slope: the intercept (planner: ``serving_buffer_bytes``);
  - **serving RSS**: RSS when the server started serving (planner: ``SERVER_PROCESS_BYTES``);
  - **planner B/row** = ``planner.bytes_per_row`` (accessor floats x 4 + ``planner.ROW_OVERHEAD_BYTES``);
  - **fp32 payload** = embedding_dim x 4 bytes: the floor any table of these embeddings needs.

* **load balance**: the default synthetic data (Zipf-skewed category frequencies, 100k rows) on 2 and on 3
  servers with the default ``shard_num`` (8 per server): rows per server and the largest / mean.

``--quick`` skips the dim-33 and SSD tables. The table is printed and written to ``--out``. The default run
takes about 6 minutes on the 2-core dev machine; data is cached in ``--work``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import log, publish  # noqa: E402
from components.config import from_dict  # noqa: E402
from components.data_prep.prepare import prepare_synthetic  # noqa: E402
from components.data_prep.synthetic import SyntheticSpec  # noqa: E402
from components.train import planner  # noqa: E402
from components.train.step import launch_ps_job  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "memory.md"
DATA_ROWS = 100_000
SIZES = {"small": 10_000, "large": 150_000}  # uniform categories per slot
VOCAB = 1 << 26  # wide hash space: few collisions, so distinct categories ~ rows
SERVERS, WORKERS, BATCH = 2, 2, 256
MIB = 1 << 20


def dataset(work: Path, name: str, spec: SyntheticSpec, vocab: int) -> Path:
    data_dir = work / f"data-{name}"
    if not (data_dir / "stats.json").exists():
        log(f"generating {name}")
        prepare_synthetic(data_dir, rows=DATA_ROWS, test_fraction=0.05, num_shards=WORKERS, vocab_size=vocab, seed=0,
                          spec=spec)
    return data_dir


def run_job(data_dir: Path, work: Path, *, servers: int, dim: int = 9, table_class: str = "MemorySparseTable",
            vocab: int = VOCAB) -> dict:
    """One job; per server: rows, RSS when serving, peak RSS."""
    cfg = from_dict({
        "model": {"hidden": [16]},
        "table": {"embedding_dim": dim, "vocab_size": vocab, "table_class": table_class, "rule": "adagrad"},
        "ps": {"servers": servers, "workers": WORKERS, "epochs": 1, "batch_size": BATCH},
        "checkpoint": {"uri": str(work / "ckpt")},
        "run_dir": str(work),
    })
    result = launch_ps_job(cfg, data_dir, work / "logs", echo=lambda line: None)
    rows = result.checkpoints[-1]["servers"]["rows"]
    return {"rows": rows, "memory": result.server_memory, "plan": result.plan, "seconds": result.seconds}


def slope_fit(small: dict, large: dict) -> dict:
    """Per-row slope and intercept of server RSS growth, averaged over the servers."""
    slopes, intercepts, serving = [], [], []
    for s in range(len(small["rows"])):
        growth = [job["memory"][s]["peak_rss"] - job["memory"][s]["serving_rss"] for job in (small, large)]
        slope = (growth[1] - growth[0]) / (large["rows"][s] - small["rows"][s])
        slopes.append(slope)
        intercepts.append(growth[0] - small["rows"][s] * slope)
        serving += [job["memory"][s]["serving_rss"] for job in (small, large)]
    return {"slope": sum(slopes) / len(slopes), "slopes": slopes, "intercept": sum(intercepts) / len(intercepts),
            "serving": sum(serving) / len(serving)}


def render(rows: list[dict], balance: list[dict], meta: dict) -> str:
    lines = [
        "# Server memory per embedding row: measured vs. planner vs. fp32 payload",
        "",
        f"{meta['when']} | Paddle 2.6.2 (CPU) | {meta['cpus']} CPU cores | {SERVERS} servers, {WORKERS} workers, batch "
        f"{BATCH}, adagrad, 1 pass over {DATA_ROWS:,} synthetic rows (26 slots, uniform ids) per job",
        "",
        "| table | dim | rows per server (small -> large) | measured B/row | planner B/row | measured / planner "
        "| fp32 payload B/row | measured / payload | fixed growth MiB (planner) | serving RSS MiB (planner) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['table']} | {r['dim']} | {r['skipped']} | | | | | | | |")
            continue
        fit, payload = r["fit"], r["dim"] * 4
        per_server = " / ".join(f"{s:,.0f}" for s in fit["slopes"])
        lines.append(
            f"| {r['table']} | {r['dim']} | {r['small_rows']:,} -> {r['large_rows']:,} | {fit['slope']:.0f} "
            f"({per_server}) | {r['planner']} | **{fit['slope'] / r['planner']:.2f}** | {payload} | "
            f"{fit['slope'] / payload:.1f} | {fit['intercept'] / MIB:.0f} ({r['planner_fixed'] / MIB:.0f}) | "
            f"{fit['serving'] / MIB:.0f} ({planner.SERVER_PROCESS_BYTES / MIB:.0f}) |")
    lines += [
        "",
        f"Planner B/row = accessor floats x 4 + `ROW_OVERHEAD_BYTES` ({planner.ROW_OVERHEAD_BYTES}). "
        "measured B/row = slope of a server's RSS growth (peak - when serving) against its rows between the small "
        "and large job (per server in brackets); fixed growth = its intercept. Method: docstring of "
        "`bench/memory.py`.",
        "",
        "## Load balance: Zipf-skewed ids, default shard_num",
        "",
        "| servers | shard_num | distinct ids | rows per server | largest / mean |",
        "|---:|---:|---:|---|---:|",
    ]
    for b in balance:
        lines.append(f"| {b['servers']} | {b['shard_num']} | {sum(b['rows']):,} | "
                     f"{' / '.join(f'{r:,}' for r in b['rows'])} | **{planner.max_over_mean(b['rows']):.3f}** |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description="Server bytes per embedding row and load balance.")
    ap.add_argument("--quick", action="store_true", help="memory table at dim 9 only, plus the load balance")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "paddle-ps-bench-memory")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    uniform = {size: dataset(args.work, f"uniform-{cards}", SyntheticSpec(cardinalities=(cards,) * 26,
                                                                          zipf_exponent=0.0), VOCAB)
               for size, cards in SIZES.items()}
    tables = [("MemorySparseTable", 9)] + ([] if args.quick else [("MemorySparseTable", 33), ("SSDSparseTable", 9)])
    run_root = Path(tempfile.mkdtemp(prefix="run-", dir=args.work))
    rows, balance = [], []
    try:
        for table_class, dim in tables:
            jobs = {}
            try:
                for size, data_dir in uniform.items():
                    log(f"{table_class} dim {dim}, {size} ids ...")
                    jobs[size] = run_job(data_dir, run_root / f"{table_class}-{dim}-{size}", servers=SERVERS, dim=dim,
                                         table_class=table_class)
                    log(f"  rows {jobs[size]['rows']}, memory {jobs[size]['memory']}, {jobs[size]['seconds']:.0f}s")
            except Exception as err:  # e.g. a table class this Paddle build cannot run: say why in the table
                rows.append({"table": table_class, "dim": dim, "skipped": f"not measured: {type(err).__name__}: "
                                                                           f"{str(err).splitlines()[0][:200]}"})
                continue
            rows.append({"table": table_class, "dim": dim, "fit": slope_fit(jobs["small"], jobs["large"]),
                         "small_rows": sum(jobs["small"]["rows"]) // SERVERS,
                         "large_rows": sum(jobs["large"]["rows"]) // SERVERS,
                         "planner": jobs["large"]["plan"].bytes_per_row,
                         "planner_fixed": jobs["large"]["plan"].base_bytes - planner.SERVER_PROCESS_BYTES})
        zipf = dataset(args.work, "zipf", SyntheticSpec(), 1 << 20)
        for servers in (2, 3):
            log(f"load balance on {servers} servers ...")
            job = run_job(zipf, run_root / f"zipf-{servers}", servers=servers, vocab=1 << 20)
            balance.append({"servers": servers, "shard_num": job["plan"].shard_num, "rows": job["rows"]})
    finally:
        shutil.rmtree(run_root, ignore_errors=True)
    table = render(rows, balance, {"when": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count()})
    publish(table, args.out)


if __name__ == "__main__":
    main()
