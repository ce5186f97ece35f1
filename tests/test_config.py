"""The real conf/ composed through Hydra: every group option, and every validation error."""

import pytest
from hydra.errors import ConfigCompositionException

from components.config import ConfigError, Mode, ModelName, from_dict
from components.config_rules import validate
from components.data_prep.input_checks import check_inputs
from components.quantities import kubernetes_bytes
from components.train.planner import GIB
from tests.conftest import CRITEO, PROD, needs_criteo



def checked_before_anything(cfg):
    """What a local run checks before it starts anything: the config's rules, then its inputs."""
    validate(cfg)
    check_inputs(cfg)

def test_defaults(config, tmp_path):
    cfg = config()
    validate(cfg)
    assert cfg.ps.mode is Mode["async"] and (cfg.ps.servers, cfg.ps.workers) == (2, 2)
    assert cfg.model.name is ModelName.dnn
    assert cfg.cluster.runner.value == "local" and cfg.cluster.backend.value == "local"
    assert cfg.checkpoint.uri == f"{tmp_path}/checkpoint"
    assert cfg.export.dtype.value == "float32"


@pytest.mark.parametrize("group,option", [
    ("model", "dnn"), ("model", "wide_deep"), ("model", "deepfm"), ("model", "dcn"),
    ("ps", "async"), ("ps", "sync"), ("ps", "geo"), ("table", "memory"), ("table", "ssd"),
])
def test_every_group_option_composes(config, group, option):
    cfg = config(f"{group}={option}")
    validate(cfg)
    if group == "ps":
        assert cfg.ps.mode.value == option
    if group == "model":
        assert cfg.model.name.value == option


def test_cluster_is_added_explicitly(config):
    assert config("+cluster=local").cluster.backend.value == "local"


@pytest.mark.parametrize("override,allowed", [
    ("ps.mode=bogus", "[async, sync, geo]"),
    ("model.name=transformer", "[dnn, wide_deep, deepfm, dcn, custom]"),
    ("table.rule=rmsprop", "[naive, adagrad, std_adagrad, adam]"),
    ("table.table_class=HashTable", "[MemorySparseTable, SSDSparseTable]"),
    ("export.dtype=bfloat16", "[float32, float16]"),
    ("ps.compress=brotli", "[none, snappy, gzip, zlib, lz4]"),
])
def test_closed_vocabularies_fail_at_composition(config, override, allowed):
    key, _, value = override.partition("=")
    with pytest.raises(ConfigCompositionException) as err:
        config(override)
    message = str(err.value.__cause__)
    assert f"Invalid value '{value}'" in message and allowed in message and key in message


@pytest.mark.parametrize("overrides,key,value", [
    (["ps.workers=0"], "ps.workers", 0),
    (["model.optimizer=adagrad"], "model.optimizer", "adagrad"),  # Paddle 2.6.2: dense adagrad only in geo
    (["ps.servers=-1"], "ps.servers", -1),
    (["table.embedding_dim=0"], "table.embedding_dim", 0),
    (["table.embedding_dim=1"], "table.embedding_dim", 1),
    (["ps.batch_size=0"], "ps.batch_size", 0),
    (["data.test_fraction=1.5"], "data.test_fraction", 1.5),
    (["data.prep_parallelism=0"], "data.prep_parallelism", 0),
    (["data.prep_processes=0"], "data.prep_processes", 0),
    (["data.valid_fraction=0.85"], "data.valid_fraction", 0.85),
    (["ps.patience=0"], "ps.patience", 0),
    (["ps.batches_per_push=0"], "ps.batches_per_push", 0),
    (["ps.compress=lz4"], "ps.compress", "lz4"),  # Paddle's flag lists it; its brpc has no lz4 codec
    (["model.dropout=1.0"], "model.dropout", 1.0),
    (["model.embedding_l2=-0.1"], "model.embedding_l2", -0.1),
    (["ps=sync", "checkpoint.every_batches=100"], "checkpoint.every_batches", 100),
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
    ([*PROD, "cluster.steps.prepare.memory=8GB"], "cluster.steps.prepare.memory", "8GB"),
    ([*PROD, "cluster.steps.evaluate.cpu=two"], "cluster.steps.evaluate.cpu", "two"),
    ([*PROD, "cluster.steps.train.cpu_limit=1c"], "cluster.steps.train.cpu_limit", "1c"),
    ([*PROD, "cluster.servers.cpu_limit=lots"], "cluster.servers.cpu_limit", "lots"),
    ([*PROD, "cluster.step_retries=-1"], "cluster.step_retries", -1),
    ([*PROD, "cluster.backend=paddlejob", "cluster.queue_name=q"], "cluster.queue_name", "q"),
    (["eval.threshold=1.0"], "eval.threshold", 1.0),
    (["eval.min_auc=1.5"], "eval.min_auc", 1.5),
    (["ps=geo", "table.eviction.enabled=true"], "table.eviction.enabled", True),
    (["table.eviction.enabled=true", "table.eviction.show_click_decay_rate=1.5"],
     "table.eviction.show_click_decay_rate", 1.5),
    # Issue 12: values that used to pass and then spun, never fired, or broke a later step.
    (["ps.progress_period_s=0"], "ps.progress_period_s", 0.0),
    (["ps.startup_timeout_s=-5"], "ps.startup_timeout_s", -5.0),
    (["ps.stall_timeout_s=-1"], "ps.stall_timeout_s", -1.0),
    (["ps.progress_period_s=5", "ps.stall_timeout_s=10"], "ps.stall_timeout_s", 10.0),
    (["eval.roc_points=0"], "eval.roc_points", 0),
    (["eval.calibration_bins=0"], "eval.calibration_bins", 0),
    (["model.hidden=[]"], "model.hidden", []),
    ([*PROD, "cluster.run_as_user=0"], "cluster.run_as_user", 0),
    ([*PROD, "cluster.servers.memory=lots"], "cluster.servers.memory", "lots"),
    ([*PROD, "cluster.workers.memory=8 GB"], "cluster.workers.memory", "8 GB"),
    ([*PROD, "cluster.workers.cpu=two"], "cluster.workers.cpu", "two"),
    # Issue 21: downsampling, the count filter and the weights, before data prep starts.
    (["data.negative_sample_rate=0"], "data.negative_sample_rate", 0.0),
    (["data.negative_sample_rate=1.5"], "data.negative_sample_rate", 1.5),
    (["data.min_id_count=0"], "data.min_id_count", 0),
    (["data.weight_column=weight"], "data.weight_column", "weight"),  # synthetic rows carry none
    # Issue 33: the export signing key, a file this machine holds or, on Kubeflow, the Secret's.
    (["export.signing_key=/no/such/key.pem"], "export.signing_key", "/no/such/key.pem"),
    (["export.signing_key=''"], "export.signing_key", ""),
    ([*PROD, "export.signing_key=/keys/key.pem"], "export.signing_key", "/keys/key.pem"),
    ([*PROD, "export.signing_secret=Bad_Name"], "export.signing_secret", "Bad_Name"),
])
def test_validation_names_key_value_and_allowed(config, overrides, key, value):
    cfg = config(*overrides)
    with pytest.raises(ConfigError) as err:
        checked_before_anything(cfg)
    assert err.value.key == key and err.value.value == value
    assert f"config key '{key}' has value {value!r}; allowed:" in str(err.value)


@pytest.mark.parametrize("quantity,expected", [("8Gi", 8 * GIB), ("512Mi", 512 << 20), ("8G", 8e9), ("1000", 1000.0),
                                               ("1.5Gi", 1.5 * GIB)])
def test_kubernetes_quantities(quantity, expected):
    assert kubernetes_bytes(quantity) == expected


def test_kubernetes_quantity_that_is_not_one():
    with pytest.raises(ConfigError, match="cluster.servers.memory"):
        kubernetes_bytes("8 GB")
    with pytest.raises(ConfigError, match="cluster.workers.memory"):
        kubernetes_bytes("1.2.3Gi", "cluster.workers.memory")


def test_ssd_table_refuses_resume_and_says_why(config):
    """A save of an SSD table would hang the job, so nothing that needs one is accepted."""
    with pytest.raises(ConfigError) as err:
        validate(config("table=ssd", "checkpoint.resume=latest"))
    assert "'none' with table.table_class=SSDSparseTable" in str(err.value)
    assert "every save hangs" in str(err.value) and "use table=memory" in str(err.value)


@needs_criteo
def test_real_data_uri_and_glob_pass(config):
    for uri in (CRITEO / "raw_criteo_sample.tsv", CRITEO / "*.tsv"):
        validate(config("data=criteo", f"data.uri={uri}"))


_RAW_ROW = "\t".join(["1"] + ["5"] * 13 + ["ab"] * 26)


@pytest.mark.parametrize("fmt,column,text", [
    ("raw", "40", f"{_RAW_ROW}\t2.5\n" * 3),
    ("raw", "41", f"{_RAW_ROW}\tignored\t0\n1\t2\n"),  # a line without Criteo's fields is data prep's to count
    ("slot", "weight", "click:1 weight:2 1:5\n\nclick:0 1:6 weight:0.5\n"),
    ("feasign", "w", "1:1 w:1e-3 5:2\n"),
])
def test_a_weight_column_the_first_lines_hold_passes(config, tmp_path, fmt, column, text):
    (tmp_path / "in.txt").write_text(text)
    checked_before_anything(config("data=criteo", f"data.uri={tmp_path / 'in.txt'}", f"data.format={fmt}",
                                   f"data.weight_column={column}"))


@pytest.mark.parametrize("fmt,column,text,shown", [
    ("raw", "39", f"{_RAW_ROW}\t1\n", "allowed: a 0-based column index >= 40 with data.format=raw"),
    ("raw", "40", f"{_RAW_ROW}\t1\n{_RAW_ROW}\n", "in.txt:2 has no weight"),
    ("raw", "40", f"{_RAW_ROW}\tabc\n", "in.txt:1 has weight 'abc', not a finite number >= 0"),
    ("raw", "40", f"{_RAW_ROW}\t-1\n", "in.txt:1 has weight '-1', not a finite number >= 0"),
    ("slot", "weight", "click:1 weight:2 1:5\nclick:0 1:6\n", "in.txt:2 has no weight"),
    ("slot", "click", "click:1 1:5\n", "no other token's name"),
    ("feasign", "7", "1:1 5:2\n", "not digits (a slot id)"),
    ("feasign", "w", "1:1 w:1 w:2 5:2\n", "in.txt:1 has 2 weights"),
])
def test_a_weight_column_the_input_does_not_hold_fails_before_data_prep(config, tmp_path, fmt, column, text, shown):
    (tmp_path / "in.txt").write_text(text)
    with pytest.raises(ConfigError) as err:
        checked_before_anything(config("data=criteo", f"data.uri={tmp_path / 'in.txt'}", f"data.format={fmt}",
                                       f"data.weight_column={column}"))
    assert err.value.key == "data.weight_column" and err.value.value == column
    assert shown in str(err.value) and "\n" not in str(err.value)


def test_struct_round_trip_restores_ints(config, tmp_path):
    """KFP carries the config as a protobuf Struct: every number arrives as a float."""
    cfg = config()
    as_struct = {"ps": {"workers": 2.0, "epochs": 1.0}, "table": {"learning_rate": 0.05}, "run_dir": str(tmp_path)}
    rebuilt = from_dict(as_struct)
    assert rebuilt.ps.workers == 2 and isinstance(rebuilt.ps.workers, int)
    assert rebuilt.table.learning_rate == cfg.table.learning_rate


def test_a_kubeflow_driver_leaves_listing_the_data_to_the_cluster(config):
    cfg = config(*PROD, "data=criteo", "data.uri=s3://no-such-bucket-here/day_*.tsv")
    validate(cfg)  # pure: the run's first step lists the data, with the cluster's credentials
    with pytest.raises(ConfigError) as err:
        check_inputs(cfg)
    assert err.value.key == "data.uri"


def _option_leaves(path) -> dict:
    """The keys a group option file sets, as paths from the config's root (a ``# @package _global_`` file writes
    there, any other into its group), its defaults list left out."""
    import yaml

    text = path.read_text()
    node = yaml.safe_load(text) or {}
    node.pop("defaults", None)
    prefix = "" if "# @package _global_" in text else f"{path.parent.name}."
    return dict(_leaves(node, prefix))


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], node


def test_no_option_file_merely_repeats_a_schema_default():
    """A group option sets only what makes it that option: a value equal to the schema's default is allowed
    only where another option of the group sets the key otherwise (``model/dnn.yaml``'s ``name: dnn``)."""
    from omegaconf import OmegaConf

    from components.config import CtrConfig
    from tests.conftest import CONF

    defaults = OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(CtrConfig), enum_to_str=True))
    repeats = []
    for group_dir in sorted(p for p in CONF.iterdir() if p.is_dir() and p.name in defaults):
        options = {f.stem: _option_leaves(f) for f in group_dir.glob("*.yaml")}
        for option, leaves in options.items():
            for key, value in leaves.items():
                default = OmegaConf.select(defaults, key)
                default = OmegaConf.to_container(default) if OmegaConf.is_config(default) else default
                distinguishes = any(other.get(key, default) != value for other in options.values())
                if value == default and not distinguishes:
                    repeats.append(f"{group_dir.name}/{option}.yaml: {key}: {value!r}")
    assert not repeats, "option files repeat schema defaults:\n" + "\n".join(repeats)


def test_the_export_signing_key_is_auto_none_or_a_key_file(config, tmp_path):
    assert config().export.signing_key == "auto" and config().export.signing_secret == "ctr-export-signing"
    key = tmp_path / "key.pem"
    key.write_text("a PEM file: the export step reads it")
    for setting in ("auto", "none", str(key)):
        validate(config(f"export.signing_key={setting}"))
    validate(config(*PROD, "export.signing_key=none"))


def test_dense_adagrad_passes_in_geo_mode(config):
    validate(config("ps=geo", "model.optimizer=adagrad"))
