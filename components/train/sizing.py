"""Sizing a table before choosing a cluster (:func:`sizing_table`; ``bench/sizing.py`` prints it): the servers, the
checkpoint's bytes, a save's time and the traffic per batch of a table of 10^9 ids or more, from the planner's
measured constants. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from components.config import SparseRule, TableConfig
from components.table.accessor import HEADER_FLOATS, row_floats
from components.train.planner import (FLOAT_BYTES, GIB, MIB, ROW_OVERHEAD_BYTES, bytes_per_row, server_base_bytes,
                                      size)
from components.train.process_plan import GEO_TABLE_COPIES

# -- sizing a table before choosing a cluster -------------------------------------------------------------------
# A saved row's text line (the servers' own save: the key, then every float of the row, space separated), measured
# on 422,373 lines of the dim 9 adagrad tables the servers of this repo's PS tests saved on 2026-12-01 (ids below
# 2^20): 138.4 B a line. Its key took 5.94 digits (the mean of ids uniform below 2^20: :func:`mean_digits`); slot,
# unseen_days, delta_score, show and click 7.1 characters together; a weight (embed_w, embedx) 10.3; an optimizer
# state float 7.9 (embed_w's g2sum 9.1, embedx's 6.6); then one separator per field (spaces, the newline).
SAVED_HEADER_CHARS = 7.1
SAVED_WEIGHT_CHARS = 10.3
SAVED_STATE_CHARS = 7.9
KEY_BYTES = 8  # a feature id on the wire (uint64)
# Paddle's SparseAccessor pushes slot, show, click and the dim gradients of a row: dim + 3 floats.
PUSH_EXTRA_FLOATS = 3


def mean_digits(vocab_size: int) -> float:
    """Mean decimal digits of ids uniform in ``[0, vocab_size)``, as hashed ids are."""
    total, low, digits = 0, 0, 1
    while low < vocab_size:
        high = min(10 ** digits, vocab_size)
        total += (high - low) * digits
        low, digits = high, digits + 1
    return total / vocab_size


def saved_line_bytes(table: TableConfig, vocab_size: int) -> float:
    """Bytes of one row's line in the servers' saved shard files (see :data:`SAVED_HEADER_CHARS`)."""
    floats = row_floats(table)
    weights = table.embedding_dim
    state = floats - (HEADER_FLOATS - 1) - weights  # the header's last float is embed_w, a weight
    return (mean_digits(vocab_size) + SAVED_HEADER_CHARS + weights * SAVED_WEIGHT_CHARS
            + state * SAVED_STATE_CHARS + 1 + floats)


def servers_needed(rows: int, table: TableConfig, budget_bytes: float) -> Optional[int]:
    """The fewest servers that hold ``rows`` rows of ``table`` within ``budget_bytes`` each, with the default
    ``shard_num`` (every server owns as many shards, so the fullest holds ``ceil(rows / servers)``); None when even
    one row does not fit beside a server's base."""
    per_row, room = bytes_per_row(table), budget_bytes - server_base_bytes(table)
    if room < per_row:
        return None
    servers = max(1, math.ceil(rows * per_row / room))
    while math.ceil(rows / servers) * per_row > room:
        servers += 1
    return servers


@dataclass(frozen=True)
class SizingInputs:
    """What the sizing table is computed from. ``server_gib``: the memory one server may hold (its pod's limit);
    ``rows_per_s``: how fast one server saves its rows (every server saves at once); ``vocab_size``: the range ids
    are hashed into (their length in a saved line; None: ``[0, ids)``); ``batch_size`` and ``ids_per_example``: one
    worker thread's batch."""

    rows_per_s: float
    ids: tuple[int, ...] = (10 ** 9, 10 ** 10)
    server_gib: tuple[float, ...] = (256, 512)
    embedding_dim: int = 9
    rule: SparseRule = SparseRule.adagrad
    vocab_size: Optional[int] = None
    batch_size: int = 256
    ids_per_example: int = 26

    @property
    def table(self) -> TableConfig:
        return TableConfig(embedding_dim=self.embedding_dim, rule=self.rule)


@dataclass(frozen=True)
class SizingRow:
    """One table size: the servers' bytes, the servers it needs, its checkpoint, a save's time, a batch's traffic."""

    ids: int  # distinct ids: the table's rows
    bytes_per_row: int  # in a server
    table_bytes: int  # in the servers, every row
    servers: dict[float, Optional[int]]  # per-server GiB -> the fewest servers (None: none can)
    line_bytes: float  # a row's line in a saved shard file
    checkpoint_bytes: int  # the table's saved text
    save_seconds: dict[float, Optional[float]]  # per-server GiB -> a save, the fullest server writing its rows
    pull_bytes: int  # one batch of a worker thread: every id's key out, its dim weights back
    push_bytes: int  # every id's key, its gradients, show, click and slot
    geo_worker_bytes: int  # what geo mode's dense copies of a vocab_size-row table would take on every worker


def sizing_table(inputs: SizingInputs) -> list[SizingRow]:
    """The sizing of each of ``inputs.ids``: pure arithmetic on the planner's measured constants."""
    table = inputs.table
    per_row = bytes_per_row(table)
    ids_per_batch = inputs.batch_size * inputs.ids_per_example
    rows = []
    for ids in inputs.ids:
        servers = {gib: servers_needed(ids, table, gib * GIB) for gib in inputs.server_gib}
        line = saved_line_bytes(table, inputs.vocab_size or ids)
        rows.append(SizingRow(
            ids=ids, bytes_per_row=per_row, table_bytes=ids * per_row, servers=servers, line_bytes=line,
            checkpoint_bytes=round(ids * line),
            save_seconds={gib: None if n is None else math.ceil(ids / n) / inputs.rows_per_s
                          for gib, n in servers.items()},
            pull_bytes=ids_per_batch * (KEY_BYTES + FLOAT_BYTES * table.embedding_dim),
            push_bytes=ids_per_batch * (KEY_BYTES + FLOAT_BYTES * (table.embedding_dim + PUSH_EXTRA_FLOATS)),
            geo_worker_bytes=GEO_TABLE_COPIES * (inputs.vocab_size or ids) * table.embedding_dim * FLOAT_BYTES))
    return rows


def sizing_markdown(inputs: SizingInputs) -> str:
    """:func:`sizing_table` as a Markdown table, with its inputs."""
    table = inputs.table
    gibs = inputs.server_gib
    head = (["distinct ids", "B/row (server)", "table in servers"] + [f"servers at {g:g} GiB" for g in gibs]
            + ["checkpoint (text)"] + [f"save at {g:g} GiB" for g in gibs]
            + ["pull / push per batch", "geo: per worker"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in sizing_table(inputs):
        cells = ([f"{row.ids:,}", str(row.bytes_per_row), _bytes(row.table_bytes)]
                 + [f"{row.servers[g]:,}" if row.servers[g] else "-" for g in gibs]
                 + [f"{_bytes(row.checkpoint_bytes)} ({row.line_bytes:.1f} B/row)"]
                 + [_duration(row.save_seconds[g]) for g in gibs]
                 + [f"{_bytes(row.pull_bytes)} / {_bytes(row.push_bytes)}", _bytes(row.geo_worker_bytes)])
        lines.append("| " + " | ".join(cells) + " |")
    vocab = f"{inputs.vocab_size:,}" if inputs.vocab_size else "the distinct ids"
    notes = [
        f"Inputs: table.embedding_dim {table.embedding_dim}, table.rule {table.rule.value} ({row_floats(table)} "
        f"floats a row: {bytes_per_row(table)} B in a server with its {ROW_OVERHEAD_BYTES} B overhead); "
        f"table.vocab_size {vocab} (ids uniform below it: their digits in a saved line); the default shard_num "
        f"(8 per server). Servers: the fewest whose memory (the pod's limit, {size(server_base_bytes(table))} of "
        f"it before any row) holds the rows; CPU and network may call for more. Save: the fullest server writing "
        f"its rows at {inputs.rows_per_s:,.0f} rows/s, every server at once. Pull / push: one batch of "
        f"{inputs.batch_size} examples x {inputs.ids_per_example} ids of a worker thread, every id counted (an id "
        f"repeated within a batch is pulled once: an upper bound), the sparse table's traffic only (the dense "
        f"parameters add their own).",
        f"Geo: {GEO_TABLE_COPIES} dense table.vocab_size x dim float32 copies of the table on every worker "
        f"(Paddle's GeoCommunicator): not a mode for tables of this size.",
    ]
    return "\n".join(lines + [""] + notes) + "\n"


def _bytes(n: float) -> str:
    if n >= 1 << 40:
        return f"{n / (1 << 40):.2f} TiB"
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MIB:.2f} MiB" if n >= MIB else f"{n / 1024:.0f} KiB"


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"

