"""Sparse-table planning before a PS job starts: rows, bytes per row, memory per server, ``shard_num``.

Pure functions of the config and a few numbers (no Paddle, no I/O), so the plan can be printed, checked and
tested before any process starts: the job is prepared with :func:`job_plan` (:func:`resolve_shard_num` and
:func:`plan_memory`), whose :class:`~components.ps.contract.JobPlan` every process of the job gets beside the config.

**Rows.** A server holds one row per distinct feature id that was pushed to it. Ids are hashed into
``[0, table.vocab_size)``, so ``vocab_size`` bounds the rows; data prep counts the distinct ids of every
slot in the train split (``stats.json``), whose sum bounds them too (ids of two slots may collide, so the
sum can over-count but never under-count). The plan takes the smaller bound.

**Bytes per row.** Paddle 2.6.2's MemorySparseTable keeps a row as a ``std::vector<float>`` of the
SparseAccessor layout (:func:`components.table.accessor.row_floats`) behind a node of a chunk allocator, indexed by an open-addressing
hash map per local shard. :data:`~components.table.memory.ROW_OVERHEAD_BYTES` is what that costs beyond the floats,
measured.

**Admission.** With ``table.admission.embedx_threshold`` > 0 a row holds no embedx until its score reaches the
threshold (:func:`components.table.accessor.short_row_floats`): only the ids seen often enough get full rows
(:func:`full_rows`), and the plan's bytes per row are the mean over full and short rows.

Every other process: :mod:`components.train.process_plan`; sizing a table of 10^9 ids or more before choosing a
cluster: :mod:`components.train.sizing`.

**Where rows go**: :mod:`components.table.sharding`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from components.checkpoint.restore import RestoreTarget
from components.config import ClusterBackend, ConfigError, CtrConfig, Mode, TableClass, TableConfig
from components.ps.contract import JobPlan
from components.quantities import kubernetes_bytes
from components.table.accessor import row_floats, short_row_floats
from components.table.memory import FLOAT_BYTES, GIB, MIB, ROW_OVERHEAD_BYTES, MemoryPlan, size
from components.table.sharding import SHARDS_PER_SERVER, default_shard_num, max_over_mean, shards_per_server

# RSS of a server process when it starts serving (Python, Paddle, the program, an empty table): 282-290 MiB
# in the bench/memory.py jobs (an SSDSparseTable server: about 10 MiB more).
SERVER_PROCESS_BYTES = 288 * MIB
# Growth of a serving server's RSS that does not scale with its rows (RPC messages, which carry dim-wide
# rows, and per-thread malloc arenas): the intercepts of the same fits, as a line through them. Measured
# 2026-12-03 (bench/results/memory.md): 23 MiB at dim 9 and 33 MiB at dim 33, since every batch is its own
# push (ps.batches_per_push=1); Paddle's merging of about 13 batches per push had made them 31-36 and 69-74.
# Only small tables notice it.
SERVING_BUFFER_BYTES = 19 * MIB
SERVING_BUFFER_BYTES_PER_DIM = int(0.44 * MIB)
AUTO_SHARDS = f"{SHARDS_PER_SERVER} per server"
# The rows of a shard at most when the planner chooses the shard count: what the export holds of a table at a time
# (about 5x its parsed 44 B a row at dim 9: ~110 MiB), and one save file and one save thread of a server.
MAX_SHARD_ROWS = 500_000


def bytes_per_row(table: TableConfig) -> int:
    """Bytes of a full row in a server."""
    return row_floats(table) * FLOAT_BYTES + ROW_OVERHEAD_BYTES


def mean_bytes_per_row(table: TableConfig, rows: int, full: int) -> int:
    """Bytes per row in a server when ``full`` of ``rows`` rows are full and the others hold no embedx."""
    short = short_row_floats(table) * FLOAT_BYTES + ROW_OVERHEAD_BYTES
    return math.ceil((full * bytes_per_row(table) + (rows - full) * short) / rows) if rows else bytes_per_row(table)


def serving_buffer_bytes(table: TableConfig) -> int:
    """What a server's RSS grows by once it serves, whatever its rows."""
    return SERVING_BUFFER_BYTES + SERVING_BUFFER_BYTES_PER_DIM * table.embedding_dim


def server_base_bytes(table: TableConfig) -> int:
    """What a serving server holds besides its rows."""
    return SERVER_PROCESS_BYTES + serving_buffer_bytes(table)


def table_rows(vocab_size: int, distinct_ids: Optional[int]) -> tuple[int, str]:
    """The smaller of the two bounds on the rows that can exist, and which one it is."""
    if distinct_ids is not None and distinct_ids < vocab_size:
        return distinct_ids, "distinct train ids in stats.json"
    return vocab_size, "table.vocab_size"


def distinct_train_ids(stats: Optional[dict]) -> Optional[int]:
    """Sum over the slots of the distinct ids data prep counted in the train split (None without stats)."""
    if not stats or "distinct_ids" not in stats:
        return None
    return int(sum(stats["distinct_ids"].values()))


def full_rows(cfg: CtrConfig, rows: int, stats: Optional[dict]) -> tuple[int, str]:
    """``(rows that get their embedx, why)``: with ``table.admission.embedx_threshold`` > 0, the distinct ids data
    prep saw in at least ``k`` train rows (``stats["distinct_ids_seen_at_least"]``) for the largest counted ``k``
    that may reach the threshold, else every row.

    A row's score is at most ``max(nonclk_coeff, click_coeff)`` per show, and an id shows once per row it is in
    per pass, so an id of fewer than ``threshold / (max coefficient x ps.epochs)`` rows stays short (an id
    repeated within a row shows once per repeat, and a restored table's rows carry their own shows: neither is
    counted). Rounding ``k`` down over-counts the full rows: the plan errs on the side of memory.
    """
    threshold = cfg.table.admission.embedx_threshold
    if not threshold:
        return rows, "every row full"
    seen = (stats or {}).get("distinct_ids_seen_at_least")
    if not seen:
        return rows, (f"every row planned full: stats.json counts no distinct_ids_seen_at_least for "
                      f"table.admission.embedx_threshold {threshold:g}")
    score_per_row = max(cfg.table.eviction.nonclk_coeff, cfg.table.eviction.click_coeff) * cfg.ps.epochs
    rows_needed = threshold / score_per_row if score_per_row > 0 else math.inf
    counted = {int(k): int(ids) for k, ids in seen.items() if int(k) <= rows_needed}
    if not counted:
        return rows, (f"every row planned full: an id of {rows_needed:g} train rows reaches "
                      f"table.admission.embedx_threshold {threshold:g}, and stats.json counts none that few")
    k = max(counted)
    return min(rows, counted[k]), (f"ids seen in at least {k} train rows; table.admission.embedx_threshold "
                                          f"{threshold:g} needs {rows_needed:g} over {cfg.ps.epochs} pass(es)")


# -- shards ------------------------------------------------------------------------------------------------
def resolve_shard_num(configured: Optional[int], servers: int, saved: Optional[int] = None,
                      saved_in: str = "the checkpoint", rows: Optional[int] = None) -> tuple[int, str]:
    """``(shard_num, where it comes from)``.

    A restored table keeps the shard count it was saved with: a server loads a table only when it finds
    exactly ``shard_num`` files (Paddle's MemorySparseTable::Load), so a different count is refused here.
    Otherwise (unless configured) :data:`~components.table.sharding.SHARDS_PER_SERVER` per server, or more when the
    table's ``rows`` would make a shard hold more than :data:`MAX_SHARD_ROWS`: the export handles a table one shard
    at a time, so its memory follows the largest shard, not the table.
    """
    if saved is not None:
        if configured is not None and configured != saved:
            raise ConfigError("table.shard_num", configured, f"{saved} (or null) when restoring {saved_in}",
                              f"its table was saved in {saved} shards and Paddle loads a table only into as many")
        return saved, f"as saved in {saved_in}"
    if configured is not None:
        return configured, "table.shard_num"
    per_server = math.ceil((rows or 0) / servers / MAX_SHARD_ROWS)
    if per_server > SHARDS_PER_SERVER:
        return servers * per_server, f"{per_server} per server: at most {MAX_SHARD_ROWS:,} rows a shard"
    return default_shard_num(servers), AUTO_SHARDS


# -- the plan ----------------------------------------------------------------------------------------------
def job_plan(cfg: CtrConfig, stats: Optional[dict] = None, restore: Optional[RestoreTarget] = None) -> JobPlan:
    """What a job of ``cfg`` resolves before it starts, beside the config (which stays as the user wrote it).

    ``shard_num``: a restored table keeps its own; a new one gets more shards when the table's rows (bounded by
    ``stats``, the dataset's ``stats.json``, else by ``table.vocab_size``) need them. The negative sample rate is the
    one the data was prepared with (``stats``), whatever the config says: the correction every program applies and
    the checkpoint records must match the rows trained on. The memory plan is not checked here (:func:`check_fits`).
    """
    distinct_ids = distinct_train_ids(stats)
    rows, _ = table_rows(cfg.table.vocab_size, distinct_ids)
    shard_num, shard_source = resolve_shard_num(cfg.table.shard_num, cfg.ps.servers,
                                                restore.shard_num if restore else None,
                                                f"checkpoint {restore.id}" if restore else "the checkpoint",
                                                rows if stats else None)
    return JobPlan(shard_num=shard_num, shard_source=shard_source,
                   negative_sample_rate=(stats or {}).get("negative_sample_rate", cfg.data.negative_sample_rate),
                   memory=plan_memory(cfg, shard_num, shard_source, distinct_ids, stats))


def plan_memory(cfg: CtrConfig, shard_num: int, shard_source: str, distinct_ids: Optional[int],
                stats: Optional[dict] = None) -> Optional[MemoryPlan]:
    """The plan of ``cfg``'s sparse table in ``shard_num`` shards (:func:`resolve_shard_num` says from where:
    ``shard_source``); ``stats`` (the dataset's ``stats.json``) say how many rows the admission threshold leaves
    short (:func:`full_rows`). None in geo mode (geo servers keep a MemorySparseGeoTable, whose layout this does not
    model)."""
    if cfg.ps.mode is Mode.geo:
        return None
    rows, rows_source = table_rows(cfg.table.vocab_size, distinct_ids)
    full, full_source = full_rows(cfg, rows, stats)
    fullest = max(shards_per_server(shard_num, cfg.ps.servers))
    budget, budget_source = memory_budget(cfg)
    return MemoryPlan(rows=rows, rows_source=rows_source, vocab_size=cfg.table.vocab_size,
                      floats=row_floats(cfg.table), bytes_per_row=mean_bytes_per_row(cfg.table, rows, full),
                      servers=cfg.ps.servers,
                      shard_num=shard_num, shard_source=shard_source,
                      largest_server_rows=math.ceil(rows * fullest / shard_num),
                      base_bytes=server_base_bytes(cfg.table), budget_bytes=budget,
                      budget_source=budget_source, table_class=cfg.table.table_class.value, full_rows=full,
                      full_rows_source=full_source, short_floats=short_row_floats(cfg.table))


def memory_budget(cfg: CtrConfig) -> tuple[Optional[float], str]:
    """Bytes one server may hold: ``ps.memory_budget_gb``, else on Kubernetes the server pods' memory (their
    limit: above it a pod is OOM-killed), else none."""
    if cfg.ps.memory_budget_gb is not None:
        return cfg.ps.memory_budget_gb * GIB, "ps.memory_budget_gb"
    if cfg.cluster.backend is not ClusterBackend.local:
        return kubernetes_bytes(cfg.cluster.servers.memory), f"cluster.servers.memory={cfg.cluster.servers.memory}"
    return None, "set ps.memory_budget_gb to check one"


def check_fits(cfg: CtrConfig, plan: MemoryPlan) -> None:
    """Refuse a table that cannot fit its servers, with the numbers and what would make it fit."""
    if plan.fits:
        return
    budget = plan.budget_bytes
    fixes = []
    more = _servers_that_fit(plan)
    if more is not None:
        servers, fullest = more
        fixes.append(f"ps.servers={servers} ({fullest / GIB:.2f} GiB on the fullest)")
    dim = _largest_dim_that_fits(cfg, plan)
    if dim is not None:
        fixes.append(f"table.embedding_dim={dim} (or less)")
    if plan.table_class == TableClass.MemorySparseTable.value:
        fixes.append("not table=ssd: with SparseAccessor, Paddle 2.6.2's SSDSparseTable moves no row to its disk "
                     "store (the accessor's SaveSSD is false) and holds as much RAM per row (bench/memory.py: "
                     "143-155 B/row vs 146-152 for table=memory), so it does not help here")
    if budget <= plan.base_bytes:
        fixes.append(f"a budget above the {plan.base_bytes / GIB:.2f} GiB every server needs before its rows")
    raise ConfigError(
        "ps.servers", cfg.ps.servers, f"enough servers for the sparse table within {budget / GIB:.2f} GiB each "
        f"({plan.budget_source})",
        f"{plan.rows:,} rows ({plan.rows_source}) x {plan.bytes_per_row} B/row puts {plan.largest_server_rows:,} "
        f"rows on the fullest server: {plan.server_bytes / GIB:.2f} GiB with its "
        f"{plan.base_bytes / GIB:.2f} GiB base. Fixes: " + "; ".join(fixes))


def _servers_that_fit(plan: MemoryPlan, limit: int = 100_000) -> Optional[tuple[int, int]]:
    """``(the fewest servers that fit the budget, the fullest one's bytes)``; None when no count does.

    A shard_num that is set (or restored) stays; past ``shard_num`` servers the fullest still holds a shard.
    """
    room = plan.budget_bytes - plan.base_bytes
    if room <= 0:
        return None
    fixed = plan.shard_source != AUTO_SHARDS
    for servers in range(max(plan.servers + 1, math.ceil(plan.rows * plan.bytes_per_row / room)), limit + 1):
        shard_num = plan.shard_num if fixed else default_shard_num(servers)
        if fixed and servers > shard_num:
            return None
        fullest = math.ceil(plan.rows * math.ceil(shard_num / servers) / shard_num) * plan.bytes_per_row
        if fullest <= room:
            return servers, fullest + plan.base_bytes
    return None


def _largest_dim_that_fits(cfg: CtrConfig, plan: MemoryPlan) -> Optional[int]:
    for dim in range(cfg.table.embedding_dim - 1, 1, -1):
        narrower = dataclasses.replace(cfg.table, embedding_dim=dim)
        per_row = mean_bytes_per_row(narrower, plan.rows, plan.full_rows)
        if plan.largest_server_rows * per_row + server_base_bytes(narrower) <= plan.budget_bytes:
            return dim
    return None


# -- after training ------------------------------------------------------------------------------------------
def load_balance_lines(load: dict, plan: MemoryPlan) -> list[str]:
    """Readable lines of a checkpoint's per-server load (``rows``, optional ``saved_bytes``), with the plan's
    estimate of each server's memory."""
    rows = load["rows"]
    lines = [f"server load: rows {' | '.join(f'{r:,}' for r in rows)} (largest {max_over_mean(rows):.3f}x the mean); "
             f"est. {' | '.join(size(r * plan.bytes_per_row + plan.base_bytes) for r in rows)}"]
    if load.get("saved_bytes"):
        lines.append(f"server load: saved shards {' | '.join(size(b) for b in load['saved_bytes'])}")
    return lines


