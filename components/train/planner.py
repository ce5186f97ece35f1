"""Sparse-table planning before a PS job starts: rows, bytes per row, memory per server, ``shard_num``.

Pure functions of the config and a few numbers (no Paddle, no I/O), so the plan can be printed, checked and
tested before any process starts: the job is prepared with :func:`resolve_shard_num` and :func:`plan_memory`.

**Rows.** A server holds one row per distinct feature id that was pushed to it. Ids are hashed into
``[0, table.vocab_size)``, so ``vocab_size`` bounds the rows; data prep counts the distinct ids of every
slot in the train split (``stats.json``), whose sum bounds them too (ids of two slots may collide, so the
sum can over-count but never under-count). The plan takes the smaller bound.

**Bytes per row.** Paddle 2.6.2's MemorySparseTable keeps a row as a ``std::vector<float>`` of the
SparseAccessor layout (:func:`components.ps.accessor.row_floats`) behind a node of a chunk allocator, indexed by an open-addressing
hash map per local shard. :data:`ROW_OVERHEAD_BYTES` is what that costs beyond the floats, measured.

**Every other process** (:func:`plan_processes`, a :class:`JobPlan` of :class:`ProcessPlan`): only the servers
hold memory that grows with the table, but for geo workers and ``export.format=single``. A worker holds its share
of the split it scores at a checkpoint (and in geo mode Paddle's dense copies of the table), the evaluate step the
test split and the baseline's rows, the export step one table shard (``export.format=single``: every row), a
serving replica one batch. Each plan is a measured base plus the parts its data adds, named with their numbers;
the Kubeflow steps request the larger of their configured memory and the plan (:func:`step_memories`, planned
from the config alone).

**Sizing** (:func:`sizing_table`): the servers, checkpoint bytes, save time and traffic of a table of 10^9 ids
or more, from the same constants (``bench/sizing.py`` prints it).

**Where rows go**: :mod:`components.ps.sharding`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from components.config import (ClusterBackend, ConfigError, CtrConfig, DataSource, ExportFormat, FileFormat, Mode,
                               SparseRule, TableClass, TableConfig, kubernetes_bytes)
from components.ps.accessor import HEADER_FLOATS, row_floats
from components.ps.sharding import SHARDS_PER_SERVER, default_shard_num, shards_per_server

MIB, GIB = 1 << 20, 1 << 30
FLOAT_BYTES = 4

# Server RSS per row beyond the row's floats: the vector's heap block (malloc header + rounding), its
# 24-byte node in the chunk allocator and its share of the hash map's bucket array (16-byte key/pointer
# pairs, power-of-two sized, so between one and two buckets' worth per row). Measured with bench/memory.py
# (Paddle 2.6.2 CPU wheel; 2 servers, 2 workers, batch 256, adagrad): the slope of a server's peak RSS
# against its rows between two jobs of equal traffic (~130k and ~900k rows per server). Two runs gave
# 151 and 146 B/row at dim 9 (64 B of floats) and 252 and 238 B/row at dim 33 (160 B): 78-92 B over the
# floats, 85 on average. A third run (bench/results/memory.md) measured 1.02x and 1.04x the estimate.
ROW_OVERHEAD_BYTES = 85
# RSS of a server process when it starts serving (Python, Paddle, the program, an empty table): 282-290 MiB
# in the bench/memory.py jobs (an SSDSparseTable server: about 10 MiB more).
SERVER_PROCESS_BYTES = 288 * MIB
# Growth of a serving server's RSS that does not scale with its rows (RPC messages, which carry dim-wide
# rows, and per-thread malloc arenas): the intercepts of the same fits, 31 and 36 MiB at dim 9, 69 and
# 74 MiB at dim 33, as a line through their means. Only small tables notice it.
SERVING_BUFFER_BYTES = 19 * MIB
SERVING_BUFFER_BYTES_PER_DIM = int(1.6 * MIB)
AUTO_SHARDS = f"{SHARDS_PER_SERVER} per server"


def bytes_per_row(table: TableConfig) -> int:
    return row_floats(table) * FLOAT_BYTES + ROW_OVERHEAD_BYTES


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


# -- shards ------------------------------------------------------------------------------------------------
def resolve_shard_num(configured: Optional[int], servers: int, saved: Optional[int] = None,
                      saved_in: str = "the checkpoint") -> tuple[int, str]:
    """``(shard_num, where it comes from)``.

    A restored table keeps the shard count it was saved with: a server loads a table only when it finds
    exactly ``shard_num`` files (Paddle's MemorySparseTable::Load), so a different count is refused here.
    """
    if saved is not None:
        if configured is not None and configured != saved:
            raise ConfigError("table.shard_num", configured, f"{saved} (or null) when restoring {saved_in}",
                              f"its table was saved in {saved} shards and Paddle loads a table only into as many")
        return saved, f"as saved in {saved_in}"
    if configured is not None:
        return configured, "table.shard_num"
    return default_shard_num(servers), AUTO_SHARDS


# -- the plan ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryPlan:
    rows: int
    rows_source: str
    vocab_size: int
    floats: int
    bytes_per_row: int
    servers: int
    shard_num: int
    shard_source: str
    largest_server_rows: int  # the server owning the most shards
    base_bytes: int  # what a serving server holds besides its rows (server_base_bytes)
    budget_bytes: Optional[float]
    budget_source: str
    table_class: str

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
        return [
            f"memory plan: {self.rows:,} rows ({source}) x {self.bytes_per_row} B/row ({self.floats} floats = "
            f"{self.floats * FLOAT_BYTES} B + {ROW_OVERHEAD_BYTES} B table overhead)",
            f"memory plan: shard_num {self.shard_num} ({self.shard_source}): {max(shards)} shard(s) on the fullest "
            f"of {self.servers} server(s), {self.largest_server_rows:,} rows",
            f"memory plan: {size(self.server_bytes)} on the fullest server "
            f"({size(self.largest_server_rows * self.bytes_per_row)} of rows + {size(self.base_bytes)} base); {budget}",
        ]

    def summary(self) -> dict:
        """JSON-safe: what the Model artifact records about the plan."""
        return {"rows": self.rows, "bytes_per_row": self.bytes_per_row, "shard_num": self.shard_num,
                "server_gib": round(self.server_bytes / GIB, 3),
                "budget_gib": None if self.budget_bytes is None else round(self.budget_bytes / GIB, 3)}


def plan_memory(cfg: CtrConfig, distinct_ids: Optional[int], shard_source: str) -> Optional[MemoryPlan]:
    """The plan of ``cfg``'s sparse table, whose ``table.shard_num`` is resolved (:func:`resolve_shard_num`
    says from where: ``shard_source``); None in geo mode (geo servers keep a MemorySparseGeoTable, whose
    layout this does not model)."""
    if cfg.ps.mode is Mode.geo:
        return None
    rows, rows_source = table_rows(cfg.table.vocab_size, distinct_ids)
    shard_num = cfg.table.shard_num
    fullest = max(shards_per_server(shard_num, cfg.ps.servers))
    budget, budget_source = memory_budget(cfg)
    return MemoryPlan(rows=rows, rows_source=rows_source, vocab_size=cfg.table.vocab_size,
                      floats=row_floats(cfg.table), bytes_per_row=bytes_per_row(cfg.table), servers=cfg.ps.servers,
                      shard_num=shard_num, shard_source=shard_source,
                      largest_server_rows=math.ceil(rows * fullest / shard_num),
                      base_bytes=server_base_bytes(cfg.table), budget_bytes=budget,
                      budget_source=budget_source, table_class=cfg.table.table_class.value)


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
        if plan.largest_server_rows * bytes_per_row(narrower) + server_base_bytes(narrower) <= plan.budget_bytes:
            return dim
    return None


# -- every process of a run ----------------------------------------------------------------------------------
# What the processes other than the servers hold: only geo workers and a single-file export hold memory that grows
# with the table; the others follow the data they read (a worker's share of a split, the evaluation's test split and baseline rows), one table
# shard (the export) or one batch (serving). Measured 2026-12-01 on the 2-core dev machine (Paddle 2.6.2 CPU wheel,
# Python 3.11, numpy 2.4, pyarrow 26): VmRSS and VmHWM of /proc/<pid>/status, each in two fresh processes, which
# agreed within 1% unless a range is given.
#
# A PS worker before its data: the peak of both workers of a tiny local job (1 server, 2 workers, 4,000 synthetic
# rows; two runs: 359-362 MiB) less the ~8 MiB this plan gives that job's share of a split and its batches. A bare
# process that imports paddle and builds and runs a small static program holds 268 MiB; the rest is fleet's worker
# (communicator, RPC client, the training program). Paddle's forked helpers (the gloo store, a Manager: 140 MiB of
# RSS each, shared copy-on-write with their parent) are not counted.
WORKER_PROCESS_BYTES = 352 * MIB
# The evaluate step before its data: Python importing kfp and components.evaluate.step (numpy, pyarrow, matplotlib):
# 134 MiB (numpy and pyarrow alone: 62 MiB).
EVALUATE_PROCESS_BYTES = 134 * MIB
# The export step before its data: Python importing kfp, paddle and the export modules, a small static program built
# and run: 329 MiB.
EXPORT_PROCESS_BYTES = 330 * MIB
# A serving process before its data: paddle and components.export.serving, a small static program built and run:
# 283 MiB.
SERVING_PROCESS_BYTES = 283 * MIB
# A split's rows as read_shards holds them: an int64 label, dense_dim float32, and per sparse slot an int64 offset
# and an int64 per id (476 B a row for 13 dense values and 26 one-id slots: the arrays' nbytes on prepare_synthetic's
# output). Parsing a shard file needs far more while it runs (its text, per-byte masks, per-token offsets, float64
# values and line numbers): the peak over the rows' own bytes was 98 B per token of the file being parsed (one file
# of 200,000 rows, 68 tokens a row) to 118 B (four files of 50,000 rows, one after the other).
READ_PARSE_BYTES_PER_TOKEN = 120
# One ScoreCounts entry: a distinct prediction (float64) with its positive and negative counts (int64).
SCORE_COUNT_BYTES = 24
# A batch's buffers per float of its activations (dense values, looked-up rows, hidden layers): scoring the default
# dnn (dim 9, 26 slots, hidden [256, 128]: 632 floats an example with its output) in batches of 8,192 peaked 94 MiB
# above batches of 256, 11.8 KB an example: 19 B a float (Paddle's allocator keeps what a batch used). A training batch also holds the
# gradients: twice that (an estimate; at batch 256 it is a few MiB beside the base).
BATCH_BYTES_PER_FLOAT = 19
TRAIN_BATCH_COPIES = 2
# Geo mode: Paddle's GeoCommunicator keeps dense vocab_size x embedding_dim float32 copies of the table on every
# worker (the parameter, the values last sent, ...): a geo worker's peak grew by 6.1-7.1 x vocab_size x dim x 4 B
# (both workers of jobs at dim 9 with vocab_size 2^20 and 2^23, at dim 17 with 2^22).
GEO_TABLE_COPIES = 7
# The export parses a shard file into ids (uint64) and dim float32 weights a row. Over a fixed part (the dense
# program built and saved, 16 MiB parse blocks: 128 MiB covers the intercepts), exporting checkpoints of 2M rows
# (dim 9, in 1, 4 and 16 shards) peaked at up to 4x the largest shard's parsed bytes for a base of the sharded
# format, 4.6x for a delta (the parent's shard is rebuilt beside it), 4.5x the whole table's for export.format=single
# (one run of eight, beside a busy process, peaked 92 MiB higher).
EXPORT_FIXED_BYTES = 128 * MIB
EXPORT_PARSE_FACTOR = 5
# Kubeflow step requests from the plan: its bytes times this, rounded up to whole MiB (whole GiB from 1 GiB). The
# plans above came out 0-32% over the peaks measured, but runs vary (one export peaked 40% over its usual).
PLAN_MARGIN = 1.25
SPLITS = ("train", "valid", "test")
SCORED_SPLITS = ("valid", "test")  # what every worker scores at every checkpoint
PLANNED_STEPS = {"evaluate": "evaluate", "export": "export"}  # process kind -> cluster.steps field


@dataclass(frozen=True)
class DataShape:
    """What the process plans need of the prepared dataset: rows per split, rows per shard file, a row's shape.

    :func:`data_shape` makes it from ``stats.json``, else from the config: synthetic splits follow from ``data.rows``,
    files are counted by data prep (``rows`` empty: the plans leave the rows out and say so). Ids per example are
    one per sparse slot unless the data says otherwise (feasign slots may hold more).
    """

    rows: dict[str, int]  # train, valid, test; empty while not known
    shard_rows: dict[str, list[int]]  # per split, the rows of each shard file, in shard order
    dense_dim: int
    sparse_slots: int
    ids_per_example: int
    source: str

    @property
    def known(self) -> bool:
        return bool(self.rows)

    @property
    def row_bytes(self) -> int:
        """Bytes of one row read into memory (read_shards): label, dense values, per slot an offset and its ids."""
        return 8 + 4 * self.dense_dim + 8 * self.sparse_slots + 8 * self.ids_per_example

    @property
    def tokens_per_row(self) -> int:
        """Tokens of one MultiSlot line: ``1 <click>``, ``<dense_dim> <values>``, per slot ``<count> <ids>``."""
        return 2 + (1 + self.dense_dim if self.dense_dim else 0) + self.sparse_slots + self.ids_per_example

    def share(self, split: str, index: int, workers: int) -> tuple[int, int]:
        """``(rows, rows of its largest file)`` of worker ``index``'s share, the files ``split[index::workers]``."""
        files = self.shard_rows.get(split, [])[index::workers]
        return sum(files), max(files, default=0)

    def largest_share(self, split: str, workers: int) -> tuple[int, int]:
        """The share of the worker holding the most rows of ``split``."""
        return max(self.share(split, index, workers) for index in range(workers))


def data_shape(cfg: CtrConfig, stats: Optional[dict] = None) -> DataShape:
    """The dataset's shape from ``stats.json``, else what the config says of it before data prep runs."""
    from components.data_prep.formats import CRITEO_DENSE_DIM, CRITEO_SLOTS
    from components.data_prep.prepare import synthetic_split_rows
    from components.data_prep.synthetic import SyntheticSpec

    if stats and "rows" in stats and "shard_rows" in stats:
        schema = stats["schema"]
        slots = len(schema["sparse_slots"])
        return DataShape(rows={s: int(stats["rows"].get(s, 0)) for s in SPLITS},
                         shard_rows={s: [int(r) for r in stats["shard_rows"].get(s, [])] for s in SPLITS},
                         dense_dim=int(schema["dense_dim"]), sparse_slots=slots, ids_per_example=slots,
                         source="stats.json")
    data = cfg.data
    num_shards = cfg.ps.workers * data.shards_per_worker
    if data.source is DataSource.synthetic:
        spec = SyntheticSpec()
        rows = dict(zip(SPLITS, synthetic_split_rows(data.rows, data.test_fraction, data.valid_fraction)))
        # Data prep deals a split's rows round-robin over the shards.
        shard_rows = {s: [n // num_shards + (i < n % num_shards) for i in range(num_shards)] for s, n in rows.items()}
        slots = len(spec.sparse_slots)
        return DataShape(rows, shard_rows, spec.dense_dim, slots, slots, f"data.rows={data.rows:,} (synthetic)")
    if data.format is FileFormat.feasign:
        slots = len(data.slots) if data.slots else len(CRITEO_SLOTS)
        return DataShape({}, {}, 0, slots, slots, "counted by data prep" + ("" if data.slots else
                                                                             f"; {slots} slots assumed"))
    slots = len(data.slots) if data.slots else len(CRITEO_SLOTS)
    return DataShape({}, {}, CRITEO_DENSE_DIM, slots, slots, "counted by data prep")


@dataclass(frozen=True)
class Part:
    """Bytes one thing takes in a process, and what it is (with the numbers that make it)."""

    bytes: int
    what: str


@dataclass(frozen=True)
class ProcessPlan:
    """The estimated peak RSS of the fullest process of one kind, as the parts that add up to it.

    ``kind``: server, worker, evaluate, export or serving; ``count``: how many a run has (serving: per replica);
    ``driver``: what makes it grow, in words.
    """

    kind: str
    count: int
    parts: tuple[Part, ...]
    driver: str

    @property
    def bytes(self) -> int:
        return sum(part.bytes for part in self.parts)

    def line(self) -> str:
        return (f"process plan: {self.kind} x{self.count}: {size(self.bytes)} each (grows with {self.driver}) = "
                + " + ".join(f"{size(part.bytes)} {part.what}" for part in self.parts))


@dataclass(frozen=True)
class JobPlan:
    """The memory plan of every process of a run: the servers' (:class:`MemoryPlan`, None in geo mode), the
    workers', the evaluate and export steps' and a serving replica's (:class:`ProcessPlan`)."""

    memory: Optional[MemoryPlan]
    data: DataShape
    processes: tuple[ProcessPlan, ...]

    def process(self, kind: str) -> ProcessPlan:
        return next(plan for plan in self.processes if plan.kind == kind)

    def lines(self) -> list[str]:
        lines = [plan.line() for plan in self.processes]
        if self.memory is None:
            lines.insert(0, "process plan: server: not planned in geo mode (see the memory plan)")
        if not self.data.known:
            lines.append(f"process plan: split rows {self.data.source}: the worker and evaluate plans leave them "
                         f"out ({self.data.row_bytes} B a row read, {self.data.tokens_per_row} tokens a row parsed "
                         f"x {READ_PARSE_BYTES_PER_TOKEN} B while its shard file is read)")
        return lines

    def summary(self) -> dict:
        """JSON-safe: each kind's count and GiB."""
        return {plan.kind: {"count": plan.count, "gib": round(plan.bytes / GIB, 3)} for plan in self.processes}


def plan_processes(cfg: CtrConfig, data: DataShape, memory: Optional[MemoryPlan],
                   distinct_ids: Optional[int] = None) -> JobPlan:
    """Every process's plan for ``cfg`` (``table.shard_num`` resolved), its dataset ``data`` and its servers'
    ``memory`` plan (:func:`plan_memory`; None in geo mode)."""
    rows = memory.rows if memory else table_rows(cfg.table.vocab_size, distinct_ids)[0]
    processes = ([server_process(memory)] if memory else []) + [
        worker_process(cfg, data), evaluate_process(cfg, data), export_process(cfg, rows),
        serving_process(cfg, data, rows)]
    return JobPlan(memory, data, tuple(processes))


def compile_time_plan(cfg: CtrConfig) -> JobPlan:
    """What a pipeline compiled from ``cfg`` alone can plan: a fresh start (``table.shard_num`` as the config or the
    default makes it), the rows bounded by ``table.vocab_size``, the data as :func:`data_shape` reads the config."""
    shard_num, source = resolve_shard_num(cfg.table.shard_num, cfg.ps.servers)
    planned = dataclasses.replace(cfg, table=dataclasses.replace(cfg.table, shard_num=shard_num))
    return plan_processes(planned, data_shape(planned), plan_memory(planned, None, source))


def server_process(plan: MemoryPlan) -> ProcessPlan:
    return ProcessPlan("server", plan.servers, (
        Part(plan.base_bytes, "base"),
        Part(plan.largest_server_rows * plan.bytes_per_row,
             f"{plan.largest_server_rows:,} rows x {plan.bytes_per_row} B (the fullest server)")),
        "the table's rows / servers")


def read_parts(rows: int, largest_file_rows: int, data: DataShape, what: str) -> list[Part]:
    """Reading ``rows`` rows whose largest shard file holds ``largest_file_rows``: the rows, and what reading them
    needs besides (parsing one file at a time, or the copy that joins the files' rows, whichever is larger)."""
    resident = rows * data.row_bytes
    parse = largest_file_rows * data.tokens_per_row * READ_PARSE_BYTES_PER_TOKEN
    return [Part(resident, f"{what} ({rows:,} rows x {data.row_bytes} B)"),
            Part(max(parse, resident), f"reading it (a {largest_file_rows:,}-row shard file x "
                                       f"{data.tokens_per_row} tokens x {READ_PARSE_BYTES_PER_TOKEN} B)"
                 if parse >= resident else "reading it (the copy joining its files' rows)")]


def activation_floats(cfg: CtrConfig, data: DataShape) -> int:
    """Floats a batch's network holds per example: dense values, looked-up rows, hidden layers, the output."""
    return data.dense_dim + data.ids_per_example * cfg.table.embedding_dim + sum(cfg.model.hidden) + 1


def worker_process(cfg: CtrConfig, data: DataShape) -> ProcessPlan:
    """A worker: its base, the largest share of a split it scores at a checkpoint (one split at a time; worker 0 also
    merges every worker's score counts of it), its batches and, in geo mode, its dense copies of the table."""
    from components.ps.scoring import SCORE_BATCH

    ps, table = cfg.ps, cfg.table
    parts = [Part(WORKER_PROCESS_BYTES, "base")]
    scored = [split for split in SCORED_SPLITS if data.rows.get(split)]
    if scored:
        split = max(scored, key=lambda s: data.largest_share(s, ps.workers))
        rows, largest_file = data.largest_share(split, ps.workers)
        parts += read_parts(rows, largest_file, data, f"its share of the {split} split")
        parts.append(Part(data.rows[split] * SCORE_COUNT_BYTES,
                          f"the {split} split's score counts, merged by worker 0 "
                          f"({data.rows[split]:,} rows x {SCORE_COUNT_BYTES} B at most)"))
    floats = activation_floats(cfg, data)
    parts.append(Part(ps.threads * ps.batch_size * floats * BATCH_BYTES_PER_FLOAT * TRAIN_BATCH_COPIES,
                      f"training batches ({ps.threads} x {ps.batch_size} examples x {floats} floats x "
                      f"{BATCH_BYTES_PER_FLOAT * TRAIN_BATCH_COPIES} B)"))
    scoring = min(SCORE_BATCH, max((data.largest_share(s, ps.workers)[0] for s in scored), default=SCORE_BATCH))
    parts.append(Part(scoring * floats * BATCH_BYTES_PER_FLOAT,
                      f"a scoring batch ({scoring:,} examples x {floats} floats x {BATCH_BYTES_PER_FLOAT} B)"))
    driver = "its share of the scored splits"
    if ps.mode is Mode.geo:
        parts.append(Part(GEO_TABLE_COPIES * table.vocab_size * table.embedding_dim * FLOAT_BYTES,
                          f"geo: dense copies of the table (vocab_size {table.vocab_size:,} x dim "
                          f"{table.embedding_dim} x 4 B x {GEO_TABLE_COPIES})"))
        driver = "table.vocab_size (geo) and its share of the scored splits"
    return ProcessPlan("worker", ps.workers, tuple(parts), driver)


def baseline_train_rows(data: DataShape, baseline_rows: int) -> int:
    """Train rows the evaluation's baseline reads: whole shard files, in order, until it has ``baseline_rows``."""
    read = 0
    for count in data.shard_rows.get("train", []):
        if read >= baseline_rows:
            break
        read += count
    return read


def evaluate_process(cfg: CtrConfig, data: DataShape) -> ProcessPlan:
    """The evaluate step: the merged test counts (never the table) and, with ``eval.baseline``, the test split, the
    baseline's train rows and its ``eval.baseline_features`` weights with their Adagrad sums."""
    ev = cfg.eval
    parts = [Part(EVALUATE_PROCESS_BYTES, "base")]
    test = data.rows.get("test", 0)
    if test:
        parts.append(Part(2 * test * SCORE_COUNT_BYTES, f"the test split's score counts, raw and calibrated "
                                                          f"({test:,} rows x {SCORE_COUNT_BYTES} B x 2 at most)"))
    if ev.baseline:
        parts.append(Part(ev.baseline_features * 16, f"the baseline's weights ({ev.baseline_features:,} x 16 B)"))
        if data.known:
            train = baseline_train_rows(data, ev.baseline_rows)
            fitted = min(train, ev.baseline_rows)
            largest = max(max(data.shard_rows["test"], default=0), max(data.shard_rows["train"], default=0))
            resident = (test + train) * data.row_bytes
            parse = largest * data.tokens_per_row * READ_PARSE_BYTES_PER_TOKEN
            parts += [Part(test * data.row_bytes, f"the test split ({test:,} rows x {data.row_bytes} B)"),
                      Part(train * data.row_bytes, f"the baseline's train rows, whole shard files "
                                                   f"({train:,} rows x {data.row_bytes} B)"),
                      Part(max(parse, resident), f"reading them (a {largest:,}-row shard file x {data.tokens_per_row}"
                                                 f" tokens x {READ_PARSE_BYTES_PER_TOKEN} B)" if parse >= resident
                           else "reading them (the copies joining their files' rows)"),
                      Part((fitted + test) * 8 * (data.ids_per_example + 1),
                           f"the baseline's feature indices ({fitted + test:,} rows x "
                           f"{8 * (data.ids_per_example + 1)} B)")]
    return ProcessPlan("evaluate", 1, tuple(parts), "the test split and eval.baseline_rows, never the table")


def parsed_row_bytes(table: TableConfig) -> int:
    """A table row as the export parses it: its id (uint64) and embedding_dim float32 weights."""
    return 8 + FLOAT_BYTES * table.embedding_dim


def export_process(cfg: CtrConfig, rows: int) -> ProcessPlan:
    """The export step: one table shard at a time (``export.format=sharded``), or every row (``single``)."""
    table = cfg.table
    parsed = parsed_row_bytes(table)
    parts = [Part(EXPORT_PROCESS_BYTES, "base"), Part(EXPORT_FIXED_BYTES, "the dense program and parse blocks")]
    if cfg.export.format is ExportFormat.single:
        parts.append(Part(rows * parsed * EXPORT_PARSE_FACTOR,
                          f"the whole table ({rows:,} rows x {parsed} B parsed x {EXPORT_PARSE_FACTOR})"))
        return ProcessPlan("export", 1, tuple(parts), "the table's rows (export.format=single)")
    largest = math.ceil(rows / table.shard_num)  # hashed ids spread evenly over the shards
    parts.append(Part(largest * parsed * EXPORT_PARSE_FACTOR,
                      f"the largest shard ({rows:,} rows / shard_num {table.shard_num} = {largest:,} rows x {parsed} B "
                      f"parsed x {EXPORT_PARSE_FACTOR})"))
    return ProcessPlan("export", 1, tuple(parts), "the table's rows / table.shard_num")


def serving_process(cfg: CtrConfig, data: DataShape, rows: int) -> ProcessPlan:
    """A serving replica: the shards are memory-mapped, so it holds the rows one batch touches (``single``: every
    row, inside its inference model)."""
    from components.ps.scoring import SCORE_BATCH

    floats = activation_floats(cfg, data)
    parsed = parsed_row_bytes(cfg.table)
    touched = SCORE_BATCH * data.ids_per_example
    parts = [Part(SERVING_PROCESS_BYTES, "base"),
             Part(SCORE_BATCH * floats * BATCH_BYTES_PER_FLOAT,
                  f"a batch ({SCORE_BATCH:,} examples x {floats} floats x {BATCH_BYTES_PER_FLOAT} B)"),
             Part(touched * parsed, f"the rows it touches ({touched:,} ids at most x {parsed} B)")]
    if cfg.export.format is ExportFormat.single:
        parts.append(Part(rows * parsed, f"every row in the model ({rows:,} rows x {parsed} B)"))
        return ProcessPlan("serving", 1, tuple(parts), "the table's rows (export.format=single)")
    return ProcessPlan("serving", 1, tuple(parts), "one batch: the shards are memory-mapped")


def request_quantity(nbytes: float) -> str:
    """``nbytes`` as a Kubernetes memory quantity, rounded up: whole GiB from 1 GiB, else whole MiB."""
    return f"{math.ceil(nbytes / GIB)}Gi" if nbytes > GIB else f"{math.ceil(nbytes / MIB)}Mi"


def step_memory(configured: str, plan: ProcessPlan, key: str) -> tuple[str, str]:
    """``(the step pod's memory request and limit, where it comes from)``: the configured quantity, unless the plan
    times :data:`PLAN_MARGIN` needs more."""
    planned = plan.bytes * PLAN_MARGIN
    if kubernetes_bytes(configured, key) >= planned:
        return configured, key
    return request_quantity(planned), f"the {plan.kind} plan: {size(plan.bytes)} x {PLAN_MARGIN}"


def step_memories(cfg: CtrConfig, plan: Optional[JobPlan] = None) -> dict[str, tuple[str, str]]:
    """Per ``cluster.steps`` field the plan sizes (evaluate, export): ``(memory quantity, where it comes from)``
    (:func:`step_memory`) with the plan ``plan`` (default: :func:`compile_time_plan`)."""
    plan = plan or compile_time_plan(cfg)
    return {step: step_memory(getattr(cfg.cluster.steps, step).memory, plan.process(kind),
                              f"cluster.steps.{step}.memory")
            for kind, step in PLANNED_STEPS.items()}


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


def size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


def max_over_mean(rows: list[int]) -> float:
    return max(rows) / (sum(rows) / len(rows)) if sum(rows) else 1.0
