"""What a sparse table costs a server, planned before a job starts: :class:`MemoryPlan` (its rows, their bytes, the
fullest server's memory, how long a save and a restore take), with the measured costs it is made of. Pure: no
Paddle, no I/O.

The planner makes it (:func:`components.train.planner.plan_memory`); it travels in the job's plan
(:class:`components.ps.contract.JobPlan`) to the processes of the job, below which it must be importable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from components.table.sharding import shards_per_server

MIB, GIB = 1 << 20, 1 << 30
FLOAT_BYTES = 4

# Server RSS per row beyond the row's floats: the vector's heap block (malloc header + rounding), its
# 24-byte node in the chunk allocator and its share of the hash map's bucket array (16-byte key/pointer
# pairs, power-of-two sized, so between one and two buckets' worth per row). Measured with bench/memory.py
# (Paddle 2.6.2 CPU wheel; 2 servers, 2 workers, batch 256, adagrad): the slope of a server's peak RSS
# against its rows between two jobs of equal traffic (~130k and ~900k rows per server). Two runs gave
# 151 and 146 B/row at dim 9 (64 B of floats) and 252 and 238 B/row at dim 33 (160 B): 78-92 B over the
# floats, 85 on average. A third run measured 1.02x and 1.04x the estimate; the fourth (2026-12-03,
# bench/results/memory.md, with unmerged pushes) 0.94x and 0.96x: 76-77 B over the floats.
ROW_OVERHEAD_BYTES = 85
# A checkpoint's save and a restore's load, in rows per second per server: Paddle's own text save and parse of its
# shards (one thread per local shard). Measured with bench/table_scale.py on 2026-12-01: 2 servers sharing 2 cores,
# 6.2M rows each (dim 9, adagrad): a save at 91k rows/s per server, a load at 146k (656k rows each: 115k and
# 146k). A server with a core per local shard does several times better; these are the floor of this machine.
SAVE_ROWS_PER_S = 91_000
LOAD_ROWS_PER_S = 146_000


@dataclass(frozen=True)
class MemoryPlan:
    """The sparse table on its servers: the rows it can hold, their bytes, the fullest server's memory against its
    budget."""

    rows: int
    rows_source: str
    vocab_size: int
    floats: int  # of a full row
    bytes_per_row: int  # the mean over full and short rows (mean_bytes_per_row)
    servers: int
    shard_num: int
    shard_source: str
    largest_server_rows: int  # the server owning the most shards
    base_bytes: int  # what a serving server holds besides its rows (server_base_bytes)
    budget_bytes: Optional[float]
    budget_source: str
    table_class: str
    full_rows: int  # rows holding their embedx (full_rows)
    full_rows_source: str
    short_floats: int  # of a row below the admission threshold

    @property
    def server_bytes(self) -> int:
        """Estimated RSS of the fullest server."""
        return self.largest_server_rows * self.bytes_per_row + self.base_bytes

    @property
    def fits(self) -> bool:
        return self.budget_bytes is None or self.server_bytes <= self.budget_bytes

    def lines(self) -> list[str]:
        budget = (f"budget {size(self.budget_bytes)} per server ({self.budget_source})"
                  if self.budget_bytes is not None else f"no budget ({self.budget_source})")
        shards = shards_per_server(self.shard_num, self.servers)
        source = (self.rows_source if self.rows == self.vocab_size
                  else f"{self.rows_source}; vocab_size {self.vocab_size:,}")
        if self.full_rows == self.rows:
            layout = (f"{self.floats} floats = {self.floats * FLOAT_BYTES} B + {ROW_OVERHEAD_BYTES} B table overhead"
                      + ("" if self.full_rows_source == "every row full" else f"; {self.full_rows_source}"))
        else:
            layout = (f"on average: {self.full_rows:,} full rows of {self.floats} floats ({self.full_rows_source}), "
                      f"{self.rows - self.full_rows:,} without embedx of {self.short_floats}; "
                      f"+ {ROW_OVERHEAD_BYTES} B table overhead each")
        return [
            f"memory plan: {self.rows:,} rows ({source}) x {self.bytes_per_row} B/row ({layout})",
            f"memory plan: shard_num {self.shard_num} ({self.shard_source}): {max(shards)} shard(s) on the fullest "
            f"of {self.servers} server(s), {self.largest_server_rows:,} rows",
            f"memory plan: {size(self.server_bytes)} on the fullest server "
            f"({size(self.largest_server_rows * self.bytes_per_row)} of rows + {size(self.base_bytes)} base); {budget}",
            f"checkpoint plan: the fullest server saves its rows in about {self.save_s:,.0f}s and loads them on a "
            f"restore in about {self.load_s:,.0f}s ({SAVE_ROWS_PER_S:,} and {LOAD_ROWS_PER_S:,} rows/s per server, "
            "measured on 2 cores shared by 2 servers)",
        ]

    @property
    def save_s(self) -> float:
        """Seconds the fullest server takes to save its rows (the servers save in parallel)."""
        return self.largest_server_rows / SAVE_ROWS_PER_S

    @property
    def load_s(self) -> float:
        return self.largest_server_rows / LOAD_ROWS_PER_S

    def summary(self) -> dict:
        """JSON-safe: what the Model artifact records about the plan."""
        return {"rows": self.rows, "bytes_per_row": self.bytes_per_row, "shard_num": self.shard_num,
                "server_gib": round(self.server_bytes / GIB, 3), "save_s": round(self.save_s, 1),
                "load_s": round(self.load_s, 1),
                "budget_gib": None if self.budget_bytes is None else round(self.budget_bytes / GIB, 3)}


def size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"
