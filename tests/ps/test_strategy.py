"""Our config as Paddle's PS strategy, sparse table and server flags."""

import pytest

from components.config import ConfigError, CtrConfig, SparseRule, from_dict
from components.ps.strategy import (COMPRESS_TYPES, merge_limits, rpc_gflags, server_flags, sparse_table_configs,
                                     strategy_settings)


def test_sparse_table_configs_spell_out_the_rule():
    table = CtrConfig().table
    table.rule, table.learning_rate, table.embedding_dim = SparseRule.adam, 0.01, 9
    (name, configs), = sparse_table_configs(table, 24).items()
    prefix = f"table_parameters.{name}.accessor."
    assert configs[prefix + "embed_sgd_param.name"] == "SparseAdamSGDRule"
    assert configs[prefix + "embedx_sgd_param.adam.learning_rate"] == 0.01
    # Paddle checks fea_dim = dim + 2 and embedx_dim = dim - 1 for SparseAccessor.
    assert configs[prefix + "fea_dim"] == 11 and configs[prefix + "embedx_dim"] == 8
    assert configs[f"table_parameters.{name}.shard_num"] == 24
    # Eviction off: no eviction settings, but the score's coefficients are ours (admission uses the score too).
    assert {key for key in configs if "ctr_accessor_param" in key} == {
        prefix + "ctr_accessor_param.nonclk_coeff", prefix + "ctr_accessor_param.click_coeff"}
    assert configs[prefix + "ctr_accessor_param.nonclk_coeff"] == 1.0 and configs[prefix + "embedx_threshold"] == 0
    table.eviction.enabled, table.eviction.delete_after_unseen_days = True, 3
    (_, configs), = sparse_table_configs(table, 24).items()
    assert configs[prefix + "ctr_accessor_param.delete_after_unseen_days"] == 3


def test_the_admission_threshold_is_the_accessors_and_whole():
    table = from_dict({"table": {"admission": {"embedx_threshold": 3}, "eviction": {"click_coeff": 2.0}},
                       "run_dir": "."}).table
    (name, configs), = sparse_table_configs(table, 16).items()
    prefix = f"table_parameters.{name}.accessor."
    assert configs[prefix + "embedx_threshold"] == 3 and isinstance(configs[prefix + "embedx_threshold"], int)
    assert configs[prefix + "ctr_accessor_param.click_coeff"] == 2.0
    table.admission.embedx_threshold = 2.5  # Paddle's field is a uint32
    with pytest.raises(ConfigError) as err:
        sparse_table_configs(table, 16)
    assert err.value.key == "table.admission.embedx_threshold" and "\n" not in str(err.value)


@pytest.mark.parametrize("mode,k_steps,has_table", [("async", 0, True), ("sync", 0, True), ("geo", 7, False)])
def test_strategy_per_mode(mode, k_steps, has_table):
    cfg = from_dict({"ps": {"mode": mode, "geo_k_steps": 7}, "run_dir": "."})
    settings = strategy_settings(cfg, 16)
    assert settings["a_sync"] is True
    assert settings["a_sync_configs"] == {"k_steps": k_steps}
    assert (settings["sparse_table_configs"] is not None) == has_table


def test_strategy_builds_in_paddle():
    from components.ps.strategy import build_strategy

    cfg = from_dict({"table": {"rule": "adagrad", "learning_rate": 0.3}, "run_dir": "."})
    strategy = build_strategy(cfg, 16)
    (table,) = strategy.sparse_table_configs
    assert table.accessor.embed_sgd_param.name == "SparseAdaGradSGDRule"
    assert table.accessor.embedx_sgd_param.adagrad.learning_rate == pytest.approx(0.3)
    assert list(table.accessor.embedx_sgd_param.adagrad.weight_bounds) == [-10.0, 10.0]
    assert table.accessor.embedx_threshold == 0 and table.accessor.ctr_accessor_param.nonclk_coeff == 1.0


def test_each_ssd_server_keeps_its_rocksdb_in_its_own_workdir(tmp_path):
    ssd = from_dict({"table": {"table_class": "SSDSparseTable"}, "run_dir": "."})
    flags = {i: server_flags(ssd, tmp_path / f"server-{i}") for i in (0, 1)}
    assert flags[0] == {"FLAGS_rocksdb_path": str(tmp_path / "server-0" / "rocksdb")}
    assert flags[0] != flags[1]
    assert server_flags(from_dict({"run_dir": "."}), tmp_path) == {}  # a memory table opens no RocksDB


def test_the_table_takes_the_shard_count_of_the_jobs_plan_not_the_config():
    """The job is planned once (components.train.planner.job_plan): the config keeps what the user asked (null: the
    planner's choice) and the table is laid out in the plan's count."""
    (name, configs), = strategy_settings(from_dict({"run_dir": "."}), 24)["sparse_table_configs"].items()
    assert configs[f"table_parameters.{name}.shard_num"] == 24
    assert strategy_settings(from_dict({"ps": {"mode": "geo"}, "run_dir": "."}), 24)["sparse_table_configs"] is None


@pytest.mark.parametrize("batches, dense, sparse", [(1, 0, 0), (2, 1, 2), (13, 12, 13)])
def test_batches_per_push_sets_both_merge_limits_of_the_client(batches, dense, sparse):
    cfg = from_dict({"ps": {"batches_per_push": batches}, "run_dir": "."})
    flags = rpc_gflags(cfg).split()
    assert merge_limits(batches) == (dense, sparse)
    assert f"-pserver_push_dense_merge_limit={dense}" in flags and f"-pserver_push_sparse_merge_limit={sparse}" in flags
    # Paddle's 10 ms between looks at the push queues would cap a worker at 100 pushes a second.
    assert "-pserver_async_push_dense_interval_ms=1" in flags and "-pserver_async_push_sparse_interval_ms=1" in flags


@pytest.mark.parametrize("compress, number", [("none", 0), ("snappy", 1), ("gzip", 2), ("zlib", 3)])
def test_compress_sets_the_clients_compress_type(compress, number):
    cfg = from_dict({"ps": {"compress": compress}, "run_dir": "."})
    assert f"-pserver_communicate_compress_type={number}" in rpc_gflags(cfg).split()
    assert COMPRESS_TYPES[cfg.ps.compress] == number
