"""The real conf/ composed through Hydra: every group option, and every validation error."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

import pipelines
from components.config import ConfigError, Mode, ModelName, from_dict, register_configs, validate

PROD = ["+cluster=prod", "cluster.submit=false", "checkpoint.uri=s3://b/ckpt"]
CONF = Path(pipelines.__file__).resolve().parent.parent / "conf"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo"


def _config(tmp_path, *overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return from_dict(compose("config", overrides=[f"run_dir={tmp_path}", *overrides]))


def test_defaults(tmp_path):
    cfg = _config(tmp_path)
    validate(cfg)
    assert cfg.ps.mode is Mode["async"] and (cfg.ps.servers, cfg.ps.workers) == (2, 2)
    assert cfg.model.name is ModelName.dnn
    assert cfg.cluster.name == "local"
    assert cfg.checkpoint.uri == f"{tmp_path}/checkpoint"
    assert cfg.checkpoint.export_dtype.value == "float32"


@pytest.mark.parametrize("group,option", [
    ("model", "dnn"), ("model", "wide_deep"), ("model", "deepfm"),
    ("ps", "async"), ("ps", "sync"), ("ps", "geo"), ("table", "memory"), ("table", "ssd"),
])
def test_every_group_option_composes(tmp_path, group, option):
    cfg = _config(tmp_path, f"{group}={option}")
    validate(cfg)
    if group == "ps":
        assert cfg.ps.mode.value == option
    if group == "model":
        assert cfg.model.name.value == option


def test_cluster_is_added_explicitly(tmp_path):
    assert _config(tmp_path, "+cluster=local").cluster.backend.value == "local"


@pytest.mark.parametrize("override,allowed", [
    ("ps.mode=bogus", "[async, sync, geo]"),
    ("model.name=transformer", "[dnn, wide_deep, deepfm]"),
    ("table.rule=rmsprop", "[naive, adagrad, std_adagrad, adam]"),
    ("table.table_class=HashTable", "[MemorySparseTable, SSDSparseTable]"),
    ("checkpoint.export_dtype=bfloat16", "[float32, float16]"),
])
def test_closed_vocabularies_fail_at_composition(tmp_path, override, allowed):
    key, _, value = override.partition("=")
    with pytest.raises(ConfigCompositionException) as err:
        _config(tmp_path, override)
    message = str(err.value.__cause__)
    assert f"Invalid value '{value}'" in message and allowed in message and key in message


@pytest.mark.parametrize("overrides,key,value", [
    (["ps.workers=0"], "ps.workers", 0),
    (["ps.servers=-1"], "ps.servers", -1),
    (["table.embedding_dim=0"], "table.embedding_dim", 0),
    (["table.embedding_dim=1"], "table.embedding_dim", 1),
    (["ps.batch_size=0"], "ps.batch_size", 0),
    (["data.test_fraction=1.5"], "data.test_fraction", 1.5),
    (["model.hidden=[64,0]"], "model.hidden", [64, 0]),
    (["table.weight_bounds=[1.0,-1.0]"], "table.weight_bounds", [1.0, -1.0]),
    (["ps=geo", "table.vocab_size=1000000000"], "table.vocab_size", 1_000_000_000),
    (["ps=sync", "ps.sync_batches=0"], "ps.sync_batches", 0),
    (["ps=geo", "checkpoint.resume=latest"], "checkpoint.resume", "latest"),
    (["ps=geo", "checkpoint.warm_start=s3://b/run"], "checkpoint.warm_start", "s3://b/run"),
    (["table=ssd", "ps=geo"], "table.table_class", "SSDSparseTable"),
    (["table=ssd", "checkpoint.resume=latest"], "checkpoint.resume", "latest"),
    (["table=ssd", "checkpoint.warm_start=s3://b/run"], "checkpoint.warm_start", "s3://b/run"),
    (["checkpoint.keep_last=0"], "checkpoint.keep_last", 0),
    (["data=criteo"], "data.uri", None),
    (["data=criteo", "data.uri=/no/such/dir/day_*.tsv"], "data.uri", "/no/such/dir/day_*.tsv"),
    (["+cluster=prod", "checkpoint.uri=s3://b/ckpt"], "cluster.host", None),
    (["+cluster=prod", "cluster.submit=false", "checkpoint.uri=/data/ckpt"], "checkpoint.uri", "/data/ckpt"),
    ([*PROD, "data=criteo", "data.uri=/local/day_0"], "data.uri", "/local/day_0"),
    ([*PROD, "cluster.backend=local"], "cluster.backend", "local"),
    (["+cluster=local", "cluster.backend=jobset"], "cluster.backend", "jobset"),
    ([*PROD, "cluster.workers.image.digest=sha256:abc"], "cluster.workers.image.digest", "sha256:abc"),
    ([*PROD, "cluster.workers.gpus=-1"], "cluster.workers.gpus", -1),
    ([*PROD, "cluster.backend=paddlejob", "cluster.paddle_port=40000"], "cluster.paddle_port", 40000),
    ([*PROD, "cluster.start_timeout_s=-1.0"], "cluster.start_timeout_s", -1.0),
    (["ps=geo", "table.eviction.enabled=true"], "table.eviction.enabled", True),
    (["table.eviction.enabled=true", "table.eviction.show_click_decay_rate=1.5"],
     "table.eviction.show_click_decay_rate", 1.5),
])
def test_validation_names_key_value_and_allowed(tmp_path, overrides, key, value):
    cfg = _config(tmp_path, *overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.key == key and err.value.value == value
    assert f"config key '{key}' has value {value!r}; allowed:" in str(err.value)


def test_ssd_table_refuses_resume_and_says_why(tmp_path):
    """A save of an SSD table would hang the job, so nothing that needs one is accepted."""
    with pytest.raises(ConfigError) as err:
        validate(_config(tmp_path, "table=ssd", "checkpoint.resume=latest"))
    assert "'none' with table.table_class=SSDSparseTable" in str(err.value)
    assert "every save hangs" in str(err.value) and "use table=memory" in str(err.value)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data/criteo is not beside the checkout")
def test_real_data_uri_and_glob_pass(tmp_path):
    for uri in (SHARED / "raw_criteo_sample.tsv", SHARED / "*.tsv"):
        validate(_config(tmp_path, "data=criteo", f"data.uri={uri}"))


def test_struct_round_trip_restores_ints(tmp_path):
    """KFP carries the config as a protobuf Struct: every number arrives as a float."""
    cfg = _config(tmp_path)
    as_struct = {"ps": {"workers": 2.0, "epochs": 1.0}, "table": {"learning_rate": 0.05}, "run_dir": str(tmp_path)}
    rebuilt = from_dict(as_struct)
    assert rebuilt.ps.workers == 2 and isinstance(rebuilt.ps.workers, int)
    assert rebuilt.table.learning_rate == cfg.table.learning_rate


def test_a_kubeflow_driver_leaves_listing_the_data_to_the_cluster(tmp_path):
    cfg = _config(tmp_path, *PROD, "data=criteo", "data.uri=s3://no-such-bucket-here/day_*.tsv")
    validate(cfg, check_storage=False)  # the run's first step lists it, with the cluster's credentials
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.key == "data.uri"
