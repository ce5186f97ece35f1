"""The one place that maps our config onto Paddle's PS strategy, sparse table and optimizers.

Everything here is pure except :func:`build_strategy`, :func:`dense_optimizer` and :func:`install_ps_desc_settings`,
which need Paddle; the row layout of the table is :mod:`components.table.accessor`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.config import (Compression, ConfigError, CtrConfig, DenseOptimizer, Mode, SparseRule, TableClass,
                               TableConfig)
from components.networks.models import EMBEDDING_TABLE

# Paddle's names for our sparse rules and the sub-message holding their settings.
_RULES = {
    SparseRule.naive: ("SparseNaiveSGDRule", "naive"),
    SparseRule.adagrad: ("SparseAdaGradSGDRule", "adagrad"),
    SparseRule.std_adagrad: ("StdAdaGradSGDRule", "adagrad"),
    SparseRule.adam: ("SparseAdamSGDRule", "adam"),
}


def sparse_table_configs(table: TableConfig, shard_num: int, table_name: str = EMBEDDING_TABLE) -> dict[str, Any]:
    """``DistributedStrategy.sparse_table_configs`` for one table in ``shard_num`` shards (the job's plan's:
    :class:`components.ps.contract.JobPlan`), set explicitly.

    The implicit default rule learns far worse than an explicit one, so every value is spelled out.
    """
    prefix = f"table_parameters.{table_name}."
    paddle_rule, settings = _RULES[table.rule]
    configs: dict[str, Any] = {
        prefix + "table_class": table.table_class.value,
        prefix + "shard_num": shard_num,
        prefix + "accessor.accessor_class": table.accessor.value,
        prefix + "accessor.fea_dim": table.embedding_dim + 2,
        prefix + "accessor.embedx_dim": table.embedding_dim - 1,
    }
    for part in ("embed_sgd_param", "embedx_sgd_param"):
        key = f"{prefix}accessor.{part}."
        configs[key + "name"] = paddle_rule
        configs[key + f"{settings}.learning_rate"] = table.learning_rate
        configs[key + f"{settings}.initial_range"] = table.initial_range
        configs[key + f"{settings}.weight_bounds"] = list(table.weight_bounds)
        if settings == "adagrad":
            configs[key + "adagrad.initial_g2sum"] = table.initial_g2sum
    # A row's score, (show - click) * nonclk_coeff + click * click_coeff, decides both its eviction and its
    # admission, so the coefficients are always ours (Paddle's default nonclk_coeff, 0.1, would need ten shows for
    # one point of admission score).
    key = f"{prefix}accessor.ctr_accessor_param."
    for name in ("nonclk_coeff", "click_coeff"):
        configs[key + name] = getattr(table.eviction, name)
    if table.eviction.enabled:
        for name in ("show_click_decay_rate", "delete_threshold", "delete_after_unseen_days"):
            configs[key + name] = getattr(table.eviction, name)
    configs[prefix + "accessor.embedx_threshold"] = embedx_threshold(table)
    return {table_name: configs}


def embedx_threshold(table: TableConfig) -> int:
    """``table.admission.embedx_threshold`` as the accessor's field takes it: a whole score (a uint32 in Paddle's
    TableAccessorParameter); a row's embedx (its factors) is kept once its score reaches it (0: at once)."""
    threshold = table.admission.embedx_threshold
    if threshold < 0 or threshold != int(threshold):
        raise ConfigError("table.admission.embedx_threshold", threshold, "a whole number >= 0 (0: every id gets its "
                          "embedding at once)", "Paddle's SparseAccessor keeps the threshold as an unsigned integer")
    return int(threshold)


def load_dense_tables(fleet, tables_dir: str) -> list[int]:
    """On a server after ``fleet.init_server(tables_dir)``: load its part of every dense table saved there, the dense
    optimizer's state with it (Adam's moments: the saved columns after the parameter). ``init_server`` loads sparse
    tables only, and ``init_worker`` pushes no more than worker 0's parameters, so a resumed job would restart the
    moments. Returns the loaded table ids."""
    runtime = fleet.fleet._runtime_handle
    loaded = []
    for table in runtime.ps_desc_builder.tables:
        if type(table).__name__ != "DenseTable" or table.ctx.is_tensor_table() or table.ctx.is_sparse():
            continue
        table_id = table.ctx.table_id()
        if (Path(tables_dir) / f"{table_id:03d}").is_dir():
            runtime._server.load_sparse(tables_dir, "0", table_id)  # the server-side Table::Load, any table kind
            loaded.append(table_id)
    return loaded


# fleet.save_persistables modes: 0 saves every row; 3 saves every row too, then ages each by one "day"
# (SparseAccessor::UpdateStatAfterSave), which is what delete_after_unseen_days counts.
SAVE_ALL, SAVE_ALL_AND_AGE = 0, 3


def table_save_mode(table: TableConfig, ages: bool = True) -> int:
    """The save mode of a checkpoint; ``ages``: this save is the one that ages the rows (a day's first)."""
    return SAVE_ALL_AND_AGE if table.eviction.enabled and ages else SAVE_ALL


def strategy_settings(cfg: CtrConfig, shard_num: int) -> dict[str, Any]:
    """What :func:`build_strategy` sets for a table of ``shard_num`` shards, as plain data (testable without Paddle).

    ``sync`` runs on the asynchronous engine (``a_sync=False`` segfaults in SendBarrierOp on the 2.6.2
    CPU wheel); its bulk-synchronous rounds come from the trainer's per-round barriers.
    """
    geo = cfg.ps.mode is Mode.geo
    return {
        "a_sync": True,
        "a_sync_configs": {"k_steps": cfg.ps.geo_k_steps if geo else 0},
        # Geo keeps its own MemorySparseGeoTable; the table settings apply to the PS hash table.
        "sparse_table_configs": None if geo else sparse_table_configs(cfg.table, shard_num),
    }


def build_strategy(cfg: CtrConfig, shard_num: int):
    import paddle.distributed.fleet as fleet

    strategy = fleet.DistributedStrategy()
    for name, value in strategy_settings(cfg, shard_num).items():
        if value is not None:
            setattr(strategy, name, value)
    return strategy


ROCKSDB_PREFIX = "rocksdb"  # an SSD table's stores: <server workdir>/rocksdb_<local shard>


def server_flags(cfg: CtrConfig, workdir: Path) -> dict[str, str]:
    """Paddle flags a server process sets (``paddle.set_flags``) before ``fleet.init_server`` creates its tables.

    An SSDSparseTable opens one RocksDB per local shard at ``FLAGS_rocksdb_path + "_<shard>"``; the default,
    ``database`` in the working directory, would be shared by servers started in one directory, so each
    server keeps its stores in its own work directory (which exists: the role creates it first).
    """
    if cfg.table.table_class is TableClass.SSDSparseTable:
        return {"FLAGS_rocksdb_path": str(workdir / ROCKSDB_PREFIX)}
    return {}


def dense_optimizer(cfg: CtrConfig):
    """The optimizer the servers run on dense parameters."""
    import paddle

    kind = cfg.model.optimizer
    if kind is DenseOptimizer.sgd:
        return paddle.optimizer.SGD(learning_rate=cfg.model.learning_rate)
    if kind is DenseOptimizer.adagrad:
        return paddle.optimizer.Adagrad(learning_rate=cfg.model.learning_rate)
    return paddle.optimizer.Adam(learning_rate=cfg.model.learning_rate)


# Paddle's brpc defaults, which apply only while the PS parameter's init_gflags is empty.
_BRPC_DEFAULTS = ("-max_body_size=314217728", "-bthread_concurrency=40",
                  "-socket_max_unwritten_bytes=2048000000", "-max_connection_pool_size=1950")


# How often a PS client's push threads look at their queues; each look sends at most one push per table, so
# Paddle's 10 ms would cap a worker at 100 unmerged pushes a second (its trainer threads wait on a full queue).
PUSH_INTERVAL_MS = 1


def merge_limits(batches_per_push: int) -> tuple[int, int]:
    """``(pserver_push_dense_merge_limit, pserver_push_sparse_merge_limit)`` for ``batches_per_push``.

    The dense push thread waits until more than its limit are queued and sums them into one push
    (``BrpcPsClient::PushDenseTaskConsume``). The sparse one, with a limit above 0, waits for two queued pushes and
    sends once it has merged at least the limit (``PushSparseTaskConsume``); 0 sends each push as it comes.
    """
    return batches_per_push - 1, 0 if batches_per_push == 1 else batches_per_push


# brpc's CompressType numbers, which FLAGS_pserver_communicate_compress_type holds ("none:0 snappy:1 gzip:2 zlib:3
# lz4:4" in Paddle 2.6.2's brpc_ps_client.cc); the client sets it on its push requests.
COMPRESS_TYPES = {Compression.none: 0, Compression.snappy: 1, Compression.gzip: 2, Compression.zlib: 3,
                  Compression.lz4: 4}


def rpc_gflags(cfg: CtrConfig) -> str:
    """The ``init_gflags`` string every PS client and server parses when it starts."""
    dense_limit, sparse_limit = merge_limits(cfg.ps.batches_per_push)
    return " ".join(_BRPC_DEFAULTS + (
        f"-pserver_timeout_ms={cfg.ps.rpc_timeout_ms}",
        f"-pserver_connect_timeout_ms={cfg.ps.rpc_connect_timeout_ms}",
        f"-pserver_table_save_max_retry={cfg.ps.table_save_max_retry}",
        f"-pserver_push_dense_merge_limit={dense_limit}",
        f"-pserver_push_sparse_merge_limit={sparse_limit}",
        f"-pserver_async_push_dense_interval_ms={PUSH_INTERVAL_MS}",
        f"-pserver_async_push_sparse_interval_ms={PUSH_INTERVAL_MS}",
    ) + (
        f"-pserver_communicate_compress_type={COMPRESS_TYPES[cfg.ps.compress]}",
    ))


def install_ps_desc_settings(flags: str) -> None:
    """Make Paddle put ``flags`` into the PS parameter it builds, and have its tables save uncompressed text.

    Paddle 2.6.2 reads the FLAGS_pserver_* settings only from the PS parameter's ``init_gflags`` field
    (not from the environment, not from ``paddle.set_flags``), and no strategy option fills that field,
    so the descriptor builder is wrapped to set it. Its tables' ``compress_in_save`` defaults to true and no
    strategy option reaches it either: a server then pipes every shard through ``gzip`` as it saves (measured
    ~30k rows/s per server, 4 minutes for 14M rows); uncompressed, the save runs at the speed the servers format
    text. Loading reads either (it picks ``zcat`` for ``.gz`` files).
    """
    from google.protobuf import text_format
    from paddle.distributed.ps import the_one_ps

    builder = the_one_ps.PsDescBuilder
    original = getattr(builder, "_original_init", builder.__init__)

    def init(self, context):
        original(self, context)
        self.ps_desc.init_gflags = flags

    builder._original_init = original
    builder.__init__ = init
    for name in ("build_server_desc", "build_worker_desc"):
        build = getattr(builder, f"_original_{name}", getattr(builder, name))

        def uncompressed(self, _build=build):
            _build(self)
            for table in self.ps_desc.server_param.downpour_server_param.downpour_table_param:
                table.compress_in_save = False
            return text_format.MessageToString(self.ps_desc)

        setattr(builder, f"_original_{name}", build)
        setattr(builder, name, uncompressed)
