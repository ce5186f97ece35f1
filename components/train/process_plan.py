"""The memory of every process of a run but the servers (theirs: :mod:`components.train.planner`), planned before
it starts: pure functions of the config, the dataset's stats and the servers' plan.

Only the servers hold memory that grows with the table, but for geo workers and ``export.format=single``. A worker
holds its share of the split it scores at a checkpoint (and in geo mode Paddle's dense copies of the table), the
fit-baseline step the baseline's rows and its design, the evaluate step the test split and the train rows it counts
the servers' load on, the export step one table shard (``export.format=single``:
every row), a serving replica one batch. :func:`plan_processes` makes a :class:`ProcessesPlan` of :class:`ProcessPlan`:
each a measured base plus the parts its data adds, named with their numbers; the Kubeflow steps request the larger
of their configured memory and the plan (:func:`step_memories`, planned from the config alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from components.config import CtrConfig, DataSource, ExportFormat, FileFormat, Mode, TableConfig
from components.quantities import kubernetes_bytes
from components.ps.contract import JobPlan
from components.table.memory import FLOAT_BYTES, GIB, MIB, MemoryPlan, size
from components.train.planner import job_plan, table_rows

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
# The fit-baseline step before its data: Python importing kfp and components.evaluate.baseline_step (numpy, scipy,
# pyarrow): 132 MiB (2026-12-06).
BASELINE_PROCESS_BYTES = 132 * MIB
# The baseline's fit (components.evaluate.baseline) per entry of its design matrix (a train id or a dense value of a
# fitted row): the matrix and its transpose, each with float64 values, a float32 copy and int32 indices, 32 B; the
# rows' buckets before it (an int64 bucket and a slot byte an id), 9 B; and per fitted row ~12 float64 vectors (labels,
# weights, logits, curvatures, the solver's steps), 96 B. Per bucket the train rows reach, the solver's ~14 float64
# vectors (110 B); per bucket of eval.baseline_features its weight and the table finding the reached ones (13 B).
# 2026-12-06 on 800k Criteo-like train rows and 100k validation rows (2^22 buckets, 1.3M and 4.2M of them reached:
# bench/table_scale.py's small and large tables) the step peaked at 2,151 and 2,502 MiB reading the shards'
# columnar copy; this plans 2,389 and 2,688 MiB with the copy read, 5,139 and 5,438 MiB with the text parsed (a
# dataset without the copy: read_parts plans that).
DESIGN_BYTES_PER_ENTRY = 32 + 9
FITTED_ROW_BYTES = 96
REACHED_BUCKET_BYTES = 110
BUCKET_BYTES = 13
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
# (one run of eight, beside a busy process, peaked 92 MiB higher). The pipeline's export step (the serving program,
# the data's transform, the store's copy) peaked higher by a constant: 707 and 792 MiB exporting table_scale's 1.3M
# and 16.3M-row checkpoints (2026-12-06, dim 9, 16 and 34 shards), against the plan's parts of 479 and 579 MiB with
# a fixed part of 128 MiB: the fixed part is 360 MiB.
EXPORT_FIXED_BYTES = 360 * MIB
EXPORT_PARSE_FACTOR = 5
# Kubeflow step requests from the plan: its bytes times this, rounded up to whole MiB (whole GiB from 1 GiB). The
# plans above came out 0-32% over the peaks measured, but runs vary (one export peaked 40% over its usual).
PLAN_MARGIN = 1.25
SPLITS = ("train", "valid", "test")
SCORED_SPLITS = ("valid", "test")  # what every worker scores at every checkpoint
PLANNED_STEPS = {"baseline": "baseline", "evaluate": "evaluate", "export": "export"}  # kind -> cluster.steps field


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
class ProcessesPlan:
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


def plan_processes(cfg: CtrConfig, data: DataShape, plan: JobPlan,
                   distinct_ids: Optional[int] = None) -> ProcessesPlan:
    """Every process's plan for ``cfg``, the job's ``plan`` (its shard count and its servers' memory plan:
    :func:`~components.train.planner.job_plan`; no memory plan in geo mode) and its dataset ``data``."""
    memory = plan.memory
    rows = memory.rows if memory else table_rows(cfg.table.vocab_size, distinct_ids)[0]
    fitted = cfg.eval.baseline or cfg.model.blend_baseline  # what makes the pipeline fit the baseline
    processes = ([server_process(memory)] if memory else []) + [worker_process(cfg, data)] + (
        [baseline_process(cfg, data, rows)] if fitted else []) + [
        evaluate_process(cfg, data), export_process(cfg, rows, plan.shard_num), serving_process(cfg, data, rows)]
    return ProcessesPlan(memory, data, tuple(processes))


def compile_time_plan(cfg: CtrConfig) -> ProcessesPlan:
    """What a pipeline compiled from ``cfg`` alone can plan: a fresh start (``table.shard_num`` as the config or the
    default makes it), the rows bounded by ``table.vocab_size``, the data as :func:`data_shape` reads the config."""
    return plan_processes(cfg, data_shape(cfg), job_plan(cfg))


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
    from components.networks.scoring import SCORE_BATCH

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


def first_rows(data: DataShape, split: str, rows: int) -> tuple[int, int]:
    """``(rows, rows of the largest file)`` a reader of the first ``rows`` rows of ``split`` takes: whole shard
    files, in order, until it has them."""
    read, largest = 0, 0
    for count in data.shard_rows.get(split, []):
        if read >= rows:
            break
        read, largest = read + count, max(largest, count)
    return read, largest


def baseline_process(cfg: CtrConfig, data: DataShape, table_rows_bound: int) -> ProcessPlan:
    """The fit-baseline step: the first ``eval.baseline_rows`` train and validation rows, the regression's design
    matrices over them and its solver's vectors over the buckets they reach (at most ``eval.baseline_features``, at
    most the table's ``table_rows_bound`` rows)."""
    ev = cfg.eval
    parts = [Part(BASELINE_PROCESS_BYTES, "base"),
             Part(ev.baseline_features * BUCKET_BYTES, f"the weights and the buckets reached "
                                                       f"({ev.baseline_features:,} buckets x {BUCKET_BYTES} B)")]
    if data.known:
        train, largest_train = first_rows(data, "train", ev.baseline_rows)
        valid, _ = first_rows(data, "valid", ev.baseline_rows)  # read after the train rows: their parse is past
        fitted = min(train, ev.baseline_rows)
        entries = data.ids_per_example + data.dense_dim
        reached = min(ev.baseline_features, table_rows_bound, fitted * data.ids_per_example)
        parts += read_parts(train, largest_train, data, "its train rows, whole shard files")
        parts += [Part(valid * data.row_bytes, f"its validation rows ({valid:,} rows x {data.row_bytes} B)"),
                  Part(fitted * (entries * DESIGN_BYTES_PER_ENTRY + FITTED_ROW_BYTES),
                       f"the design ({fitted:,} rows x ({entries} entries x {DESIGN_BYTES_PER_ENTRY} B + "
                       f"{FITTED_ROW_BYTES} B))"),
                  Part(reached * REACHED_BUCKET_BYTES, f"the solver ({reached:,} buckets reached at most x "
                                                       f"{REACHED_BUCKET_BYTES} B)")]
    return ProcessPlan("baseline", 1, tuple(parts), "eval.baseline_rows and eval.baseline_features, never the table")


def evaluate_process(cfg: CtrConfig, data: DataShape) -> ProcessPlan:
    """The evaluate step: the merged test counts (never the table), the train rows the servers' load is counted on
    and, with ``eval.baseline``, the test split scored by the fitted baseline's ``eval.baseline_features`` weights."""
    from components.evaluate.server_load import COUNTED_ROWS

    ev = cfg.eval
    parts = [Part(EVALUATE_PROCESS_BYTES, "base")]
    test = data.rows.get("test", 0)
    if test:
        parts.append(Part(2 * test * SCORE_COUNT_BYTES, f"the test split's score counts, raw and calibrated "
                                                          f"({test:,} rows x {SCORE_COUNT_BYTES} B x 2 at most)"))
    if data.known:
        counted, largest = first_rows(data, "train", COUNTED_ROWS)
        parts += read_parts(counted, largest, data, "the train rows the servers' load is counted on")
    if ev.baseline:
        parts.append(Part(ev.baseline_features * 8, f"the baseline's weights ({ev.baseline_features:,} x 8 B)"))
        if data.known:
            largest = max(data.shard_rows["test"], default=0)
            parts += read_parts(test, largest, data, "the test split")
            parts.append(Part(test * 8 * (data.ids_per_example + 1),
                              f"the baseline's feature indices ({test:,} rows x {8 * (data.ids_per_example + 1)} B)"))
    return ProcessPlan("evaluate", 1, tuple(parts), "the test split and the counted train rows, never the table")


def parsed_row_bytes(table: TableConfig) -> int:
    """A table row as the export parses it: its id (uint64) and embedding_dim float32 weights."""
    return 8 + FLOAT_BYTES * table.embedding_dim


def export_process(cfg: CtrConfig, rows: int, shard_num: int) -> ProcessPlan:
    """The export step: one table shard of ``shard_num`` written while the next is read (``export.format=sharded``),
    or every row (``single``)."""
    parsed = parsed_row_bytes(cfg.table)
    parts = [Part(EXPORT_PROCESS_BYTES, "base"), Part(EXPORT_FIXED_BYTES, "the dense program and parse blocks")]
    if cfg.export.format is ExportFormat.single:
        parts.append(Part(rows * parsed * EXPORT_PARSE_FACTOR,
                          f"the whole table ({rows:,} rows x {parsed} B parsed x {EXPORT_PARSE_FACTOR})"))
        return ProcessPlan("export", 1, tuple(parts), "the table's rows (export.format=single)")
    largest = math.ceil(rows / shard_num)  # hashed ids spread evenly over the shards
    parts += [Part(largest * parsed * EXPORT_PARSE_FACTOR,
                   f"the largest shard ({rows:,} rows / shard_num {shard_num} = {largest:,} rows x {parsed} B "
                   f"parsed x {EXPORT_PARSE_FACTOR})"),
              Part(largest * parsed, f"the shard written while the next is read ({largest:,} rows x {parsed} B)")]
    return ProcessPlan("export", 1, tuple(parts), "the table's rows / table.shard_num")


def serving_process(cfg: CtrConfig, data: DataShape, rows: int) -> ProcessPlan:
    """A serving replica: the shards are memory-mapped, so it holds the rows one batch touches (``single``: every
    row, inside its inference model)."""
    from components.networks.scoring import SCORE_BATCH

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


def step_memories(cfg: CtrConfig, plan: Optional[ProcessesPlan] = None) -> dict[str, tuple[str, str]]:
    """Per ``cluster.steps`` field the plan sizes (baseline, evaluate, export): ``(memory quantity, where it comes from)``
    (:func:`step_memory`) with the plan ``plan`` (default: :func:`compile_time_plan`)."""
    plan = plan or compile_time_plan(cfg)
    kinds = {process.kind for process in plan.processes}  # no baseline process where nothing fits one
    return {step: step_memory(getattr(cfg.cluster.steps, step).memory, plan.process(kind),
                              f"cluster.steps.{step}.memory")
            for kind, step in PLANNED_STEPS.items() if kind in kinds}

