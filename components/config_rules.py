"""The checks of a config that its types cannot express: counts > 0, mode-specific limits, what Paddle 2.6.2
accepts, the cluster's names and quantities. Pure: nothing here reads storage or the network (the inputs are
:mod:`components.data_prep.input_checks`'s), so every process can run them, and they run before anything
expensive starts. Each failure is one :class:`~components.config.ConfigError` naming the key, the value and what
is allowed."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Optional

from components.config import (Accessor, ClusterBackend, Compression, ConfigError, CtrConfig, DataConfig, DataSource,
                               DenseOptimizer, EvalConfig, ExportFormat, FileFormat, Mode, ModelConfig, ModelName,
                               PipelineRunner, PsConfig, StepResources, TableClass, to_dict)
from components.quantities import check_cpu, kubernetes_bytes
from components.redaction import url_with_password


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(key, value, "a number > 0")


_NETWORK_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _validate_network(model: ModelConfig) -> None:
    """model=custom names its network, and only it does; whether the path imports is checked where it runs."""
    if model.name is ModelName.custom and not (model.network and _NETWORK_PATH.match(model.network)):
        raise ConfigError("model.network", model.network, "'package.module:function' with model=custom",
                          "the function builds the network (README: bring your own network)")
    if model.name is not ModelName.custom and (model.network or model.extra_ops):
        key = "model.network" if model.network else "model.extra_ops"
        raise ConfigError(key, getattr(model, key.split(".")[1]), f"unset with model={model.name.value}",
                          "set model=custom to train a network of your own")


def validate(cfg: CtrConfig) -> None:
    """Checks beyond types, on the config alone (no storage is read: the inputs are checked by
    :func:`components.data_prep.input_checks.check_inputs`); raises :class:`ConfigError` before anything expensive
    starts."""
    _refuse_url_passwords(cfg)
    for key in ("ps.servers", "ps.workers", "ps.threads", "ps.batch_size", "ps.epochs",
                "table.embedding_dim", "table.vocab_size", "table.learning_rate",
                "model.learning_rate", "data.shards_per_worker", "data.prep_parallelism", "ps.patience",
                "model.cross_layers", "eval.baseline_rows", "eval.baseline_features", "ps.rpc_timeout_ms",
                "ps.rpc_connect_timeout_ms", "ps.table_save_max_retry", "ps.batches_per_push"):
        group, name = key.split(".")
        _positive(key, getattr(getattr(cfg, group), name))
    for key, value in (("table.shard_num", cfg.table.shard_num), ("ps.memory_budget_gb", cfg.ps.memory_budget_gb),
                       ("data.prep_processes", cfg.data.prep_processes)):
        if value is not None:  # null: chosen by the planner / no budget
            _positive(key, value)
    if cfg.export.base_every < 0:
        raise ConfigError("export.base_every", cfg.export.base_every, "a number >= 0 (0: every export is a base)")
    _validate_signing(cfg)
    if cfg.ps.mode is Mode.geo:
        _positive("ps.geo_k_steps", cfg.ps.geo_k_steps)
    if cfg.ps.mode is Mode.sync:
        _positive("ps.sync_batches", cfg.ps.sync_batches)
    _validate_network(cfg.model)
    if cfg.ps.compress is Compression.lz4:
        # brpc names lz4 (CompressType 4, which Paddle's flag lists) but the wheel's brpc registers no lz4 codec
        raise ConfigError("ps.compress", "lz4", "none, snappy, gzip or zlib", "Paddle 2.6.2's brpc has no lz4 codec: "
                          "every push would fail ('Fail to compress request, compress_type=4') and the job learn nothing")
    if cfg.model.optimizer is DenseOptimizer.adagrad and cfg.ps.mode is not Mode.geo:
        # Paddle 2.6.2's the_one_ps builds the servers' dense optimizer from sgd or adam only, except in geo mode
        raise ConfigError("model.optimizer", "adagrad", f"sgd or adam with ps.mode={cfg.ps.mode.value}",
                          "the servers apply adagrad to dense parameters only with ps.mode=geo")
    if cfg.table.accessor is Accessor.SparseAccessor and cfg.table.embedding_dim < 2:
        raise ConfigError("table.embedding_dim", cfg.table.embedding_dim, "an integer >= 2",
                          "SparseAccessor splits a row into 1 embed weight + (dim - 1) embedx weights")
    if cfg.ps.mode is Mode.geo and cfg.table.vocab_size * cfg.table.embedding_dim > 1 << 28:
        raise ConfigError("table.vocab_size", cfg.table.vocab_size,
                          f"vocab_size * embedding_dim <= {1 << 28} in geo mode",
                          "each geo worker holds a dense local copy of the whole table; use ps.mode=async")
    if not cfg.model.hidden or any(h <= 0 for h in cfg.model.hidden):
        raise ConfigError("model.hidden", list(cfg.model.hidden), "a non-empty list of layer widths > 0")
    if not 0 <= cfg.model.dropout < 1:
        raise ConfigError("model.dropout", cfg.model.dropout, "a rate in [0, 1)")
    if cfg.model.embedding_l2 < 0:
        raise ConfigError("model.embedding_l2", cfg.model.embedding_l2, "a penalty >= 0")
    _validate_timing(cfg.ps)
    if cfg.eval.roc_points < 2:
        raise ConfigError("eval.roc_points", cfg.eval.roc_points, "an integer >= 2 (a curve needs two points)")
    _positive("eval.calibration_bins", cfg.eval.calibration_bins)
    if not 0 < cfg.data.test_fraction < 1:
        raise ConfigError("data.test_fraction", cfg.data.test_fraction, "a fraction in (0, 1)")
    if not 0 <= cfg.data.valid_fraction < 1 - cfg.data.test_fraction:
        raise ConfigError("data.valid_fraction", cfg.data.valid_fraction,
                          f"a fraction in [0, 1 - data.test_fraction = {1 - cfg.data.test_fraction:g})")
    if not 0 <= cfg.data.max_malformed_fraction <= 1:
        raise ConfigError("data.max_malformed_fraction", cfg.data.max_malformed_fraction, "a fraction in [0, 1]")
    _validate_days(cfg)
    _validate_row_filters(cfg.data)
    _validate_weight_column(cfg.data)
    if cfg.data.source is DataSource.synthetic:
        _positive("data.rows", cfg.data.rows)
    elif not cfg.data.uri:
        raise ConfigError("data.uri", cfg.data.uri, "a path, glob or fsspec URL of the input files",
                          "set data.uri=... when data=criteo")
    if len(cfg.table.weight_bounds) != 2 or cfg.table.weight_bounds[0] >= cfg.table.weight_bounds[1]:
        raise ConfigError("table.weight_bounds", list(cfg.table.weight_bounds), "[low, high] with low < high")
    _positive("checkpoint.every_passes", cfg.checkpoint.every_passes)
    _positive("checkpoint.keep_last", cfg.checkpoint.keep_last)
    _positive("checkpoint.chunk_batches", cfg.checkpoint.chunk_batches)
    if cfg.checkpoint.every_minutes < 0:
        raise ConfigError("checkpoint.every_minutes", cfg.checkpoint.every_minutes, "minutes >= 0 (0 = off)")
    if cfg.checkpoint.every_batches < 0:
        raise ConfigError("checkpoint.every_batches", cfg.checkpoint.every_batches, "batches >= 0 (0 = off)")
    if cfg.checkpoint.every_batches and cfg.ps.mode is Mode.sync:
        raise ConfigError("checkpoint.every_batches", cfg.checkpoint.every_batches, "0 with ps.mode=sync",
                          "sync passes are cut into rounds of ps.sync_batches already; checkpoint every pass")
    ssd = cfg.table.table_class is TableClass.SSDSparseTable
    eviction = cfg.table.eviction
    if eviction.enabled:
        if cfg.ps.mode is Mode.geo or ssd:
            raise ConfigError("table.eviction.enabled", True, "false in geo mode and with SSDSparseTable",
                              "only the PS MemorySparseTable shrinks; geo servers keep their own table, and an "
                              "SSD table cannot be saved, which is what ages its rows")
        if not 0 < eviction.show_click_decay_rate <= 1:
            raise ConfigError("table.eviction.show_click_decay_rate", eviction.show_click_decay_rate, "a rate in (0, 1]")
        if eviction.delete_after_unseen_days < 0:
            raise ConfigError("table.eviction.delete_after_unseen_days", eviction.delete_after_unseen_days,
                              "checkpoints >= 0")
    if ssd and cfg.ps.mode is Mode.geo:
        raise ConfigError("table.table_class", cfg.table.table_class.value, "MemorySparseTable in geo mode",
                          "geo servers keep their own MemorySparseGeoTable; use ps=async or ps=sync for table=ssd")
    if cfg.ps.mode is Mode.geo:
        _refuse_restore(cfg, "in geo mode", "geo servers do not save their table in Paddle 2.6.2, so a geo job "
                                            "cannot restore one")
    if ssd:
        _refuse_restore(cfg, "with table.table_class=SSDSparseTable",
                        "Paddle 2.6.2 cannot save an SSDSparseTable (SSDSparseTable::Save locks the table mutex, then "
                        "SaveWithString locks it again: every save hangs), and its init_server load reads only its own "
                        "binary format, so an SSD job has no table of its own to restore and cannot load a memory "
                        "table's; use table=memory to resume or warm-start")
    if cfg.objective not in ("auc", "logloss"):
        raise ConfigError("objective", cfg.objective, "'auc' or 'logloss'")
    if cfg.eval.threshold is not None and not 0 < cfg.eval.threshold < 1:
        raise ConfigError("eval.threshold", cfg.eval.threshold, "null (the training CTR) or a probability in (0, 1)")
    if not 0 <= cfg.eval.min_auc <= 1:
        raise ConfigError("eval.min_auc", cfg.eval.min_auc, "an AUC in [0, 1] (0: always export)")
    check_eval_slots(cfg.eval, slots_before_prep(cfg.data))
    _validate_cluster(cfg)


def _refuse_url_passwords(cfg: CtrConfig) -> None:
    """No ``user:password@`` in any value: the config is printed, kept in the run directory, compiled into the
    pipeline and passed to every step and pod, so a password in it would be everywhere."""
    found = next(url_with_password(to_dict(cfg)), None)
    if found is not None:
        raise ConfigError(*found, "a URL without a password (user:password@)",
                          "the config is stored with the run and in the pipeline: give the store's credentials in "
                          "the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, fsspec's "
                          "FSSPEC_<PROTOCOL>_<OPTION>) and, on Kubeflow, as cluster.storage_secrets")


# The sparse slots of synthetic data and of the two Criteo formats (components.data_prep.formats.CRITEO_SLOTS,
# which this bottom layer cannot import; a test holds the two equal).
CRITEO_SLOT_NAMES = tuple(f"C{index}" for index in range(1, 27))


def slots_before_prep(data: DataConfig) -> Optional[list[str]]:
    """The sparse slots the data will have, as far as the config tells: None for feasign input without
    ``data.slots``, whose slots data prep finds in the input."""
    if data.source is DataSource.files and data.slots:
        return list(data.slots)
    if data.source is DataSource.synthetic or data.format is not FileFormat.feasign:
        return list(CRITEO_SLOT_NAMES)
    return None


def check_eval_slots(cfg: EvalConfig, slots: Optional[list[str]]) -> None:
    """``eval.group_by`` and ``eval.slices`` name one of ``slots``, the data's sparse slots (None: not known yet,
    checked once a dataset's schema is)."""
    if cfg.slice_top < 1:
        raise ConfigError("eval.slice_top", cfg.slice_top, "an integer >= 1 (the slices listed)")
    for key, slot in (("eval.group_by", cfg.group_by), ("eval.slices", cfg.slices)):
        if slot is not None and slots is not None and slot not in slots:
            raise ConfigError(key, slot, f"a sparse slot of the data: {', '.join(slots)}")


MIN_PROGRESS_PERIOD_S = 0.1


def _validate_days(cfg: CtrConfig) -> None:
    """Day partitions (components/days.py): a {day} data.uri names its days, the days are in order, and their
    runs can continue one checkpoint store."""
    from components.days import DayError, expand_days, is_daily

    data = cfg.data
    daily = is_daily(data.uri) and data.source is DataSource.files
    scheduled = cfg.cluster.runner is PipelineRunner.kubeflow and cfg.cluster.schedule
    if data.days is not None or data.day is not None:
        if not daily:
            raise ConfigError("data.uri", data.uri, "a file URI holding a {day} placeholder when data.days is set",
                              "e.g. \"data.uri='/logs/day_{day}.tsv'\" (the inner quotes keep Hydra off the braces)")
        try:
            days = expand_days(data.days or [])
        except DayError as err:
            raise ConfigError("data.days", list(data.days or []), "day names in the order they happened",
                              str(err)) from None
        if data.days is not None and not days:
            raise ConfigError("data.days", [], "at least one day")
        if data.day is not None and data.days is not None and str(data.day) not in days:
            raise ConfigError("data.day", data.day, f"one of data.days ({days[0]} .. {days[-1]})")
    elif daily and not scheduled:
        raise ConfigError("data.days", None, "the days to train, in order (data.days=[2026-11-01,2026-11-02] or "
                          "data.days=[2026-11-01..2026-11-07])", f"data.uri {data.uri} holds a {{day}} placeholder")
    if cfg.cluster.schedule is not None and not daily:
        raise ConfigError("cluster.schedule", cfg.cluster.schedule, "null unless data.uri holds a {day} placeholder",
                          "a recurring run trains one day per run")
    fields = len(str(cfg.cluster.schedule).split())
    if cfg.cluster.schedule is not None and fields != 6:
        raise ConfigError("cluster.schedule", cfg.cluster.schedule, "a cron expression of KFP's 6 fields, seconds first "
                          "(\"cluster.schedule='0 0 2 * * *'\": 02:00 UTC every day)",
                          "KFP's cron has a seconds field before the minutes: put 0 in front" if fields == 5 else "")
    if daily:
        if cfg.checkpoint.resume not in ("none", "auto"):
            raise ConfigError("checkpoint.resume", cfg.checkpoint.resume, "none or auto with day partitions",
                              "each day continues from the model the day before delivered (the store's days)")
        if cfg.ps.mode is Mode.geo or cfg.table.table_class is TableClass.SSDSparseTable:
            raise ConfigError("data.days", list(data.days or []), "no day partitions in geo mode or with "
                              "SSDSparseTable", "a day continues the day before's table, which these servers "
                              "cannot save and restore in Paddle 2.6.2; use ps=async or ps=sync with table=memory")
        if data.day_lag < 0:
            raise ConfigError("data.day_lag", data.day_lag, "days >= 0")


def _validate_timing(ps: PsConfig) -> None:
    """The periods and timeouts of a running job: a reporting loop must not spin, a timeout must be able to pass."""
    if not ps.progress_period_s >= MIN_PROGRESS_PERIOD_S:
        raise ConfigError("ps.progress_period_s", ps.progress_period_s, f"seconds >= {MIN_PROGRESS_PERIOD_S}",
                          "every role reports this often")
    _positive("ps.startup_timeout_s", ps.startup_timeout_s)
    if not ps.stall_timeout_s >= 3 * ps.progress_period_s:
        raise ConfigError("ps.stall_timeout_s", ps.stall_timeout_s,
                          f"seconds >= 3 x ps.progress_period_s ({3 * ps.progress_period_s:g})",
                          "a role reports every ps.progress_period_s; a shorter timeout would fail healthy jobs")


def _validate_row_filters(data: DataConfig) -> None:
    """Negative downsampling keeps a fraction of the train negatives; the count filter needs a count."""
    if not 0 < data.negative_sample_rate <= 1:
        raise ConfigError("data.negative_sample_rate", data.negative_sample_rate,
                          "a rate in (0, 1] (1: keep every negative)")
    if data.min_id_count < 1:
        raise ConfigError("data.min_id_count", data.min_id_count, "an integer >= 1 (1: no count filter)")


# Criteo TSV's fields (label, I1-I13, C1-C26): a raw weight column comes after them.
RAW_FIELDS = 40


def _validate_weight_column(data: DataConfig) -> None:
    """Where the weights are, as data.format can hold them (components/data_prep/formats.py tells the formats);
    whether the input holds them is :func:`_check_sampled_weights`'s."""
    column = data.weight_column
    if column is None:
        return
    if data.source is DataSource.synthetic:
        raise ConfigError("data.weight_column", column, "null with data.source=synthetic",
                          "synthetic rows carry no weights")
    if data.format is FileFormat.raw:
        if not (column.isascii() and column.isdigit() and int(column) >= RAW_FIELDS):
            raise ConfigError("data.weight_column", column, f"a 0-based column index >= {RAW_FIELDS} with "
                              f"data.format=raw (after Criteo's {RAW_FIELDS} fields), e.g. {RAW_FIELDS}")
        return
    # A slot line's other names; a feasign token is "<feasign>:<slot id>", so a weight named by digits is one.
    taken = {"click", "dense_feature", *(slot[1:] for slot in CRITEO_SLOT_NAMES)} \
        if data.format is FileFormat.slot else set()
    plain = column and ":" not in column and not any(ch.isspace() for ch in column)
    if not plain or column in taken or (data.format is FileFormat.feasign and column.isdigit()):
        raise ConfigError("data.weight_column", column, f"the name of the weight tokens with data.format="
                          f"{data.format.value} ('weight' for weight:2.5): no ':' or spaces, no other token's name"
                          + (", not digits (a slot id)" if data.format is FileFormat.feasign else ""))


def _refuse_restore(cfg: CtrConfig, condition: str, why: str) -> None:
    """Jobs whose servers keep no loadable table: nothing may be restored into them."""
    for key, value, unset in (("checkpoint.resume", cfg.checkpoint.resume, "none"),
                              ("checkpoint.warm_start", cfg.checkpoint.warm_start, None)):
        if value != unset:
            raise ConfigError(key, value, f"{unset!r} {condition}", why)


_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Kubernetes quantities in the forms KFP accepts for a step's resources (kfp.dsl.PipelineTask).
# Kueue manages JobSets and Kubeflow Trainer TrainJobs, not PaddleFlow's PaddleJob.
KUEUE_BACKENDS = ("trainjob", "jobset")


def is_remote_uri(uri: Optional[str]) -> bool:
    """A URL another machine can read (s3://, hdfs://, ...): not a local path, not file://."""
    return bool(uri) and "://" in uri and not uri.startswith("file://")  # type: ignore[operator]


def _validate_signing(cfg: CtrConfig) -> None:
    """``export.signing_key`` names a key the export step can read: a path only where this machine's files are
    the step's (a Kubeflow step sees the Secret ``export.signing_secret``, which ``auto`` uses there)."""
    key, secret = cfg.export.signing_key, cfg.export.signing_secret
    words = ("auto", "none")
    if not _DNS_SUBDOMAIN.match(secret or ""):
        raise ConfigError("export.signing_secret", secret, "a Kubernetes Secret name (lowercase letters, digits, "
                          "'-' and '.')")
    if cfg.cluster.runner is PipelineRunner.kubeflow:
        if key not in words:
            raise ConfigError("export.signing_key", key, "auto or none when cluster.runner=kubeflow",
                              f"put the key in the Secret {secret} (keys key.pem and key.pub) and use auto")
        return
    if key not in words and not (key and Path(key).expanduser().is_file()):
        raise ConfigError("export.signing_key", key, "auto (the per-user key), none (unsigned exports) or the path "
                          "of a PEM PKCS#8 EC P-256 private key file",
                          "make one with `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out key.pem`")


def _validate_cluster(cfg: CtrConfig) -> None:
    cluster = cfg.cluster
    if cluster.runner is PipelineRunner.local:
        if cluster.backend is not ClusterBackend.local:
            raise ConfigError("cluster.backend", cluster.backend.value, "local when cluster.runner=local",
                              "the trainjob, jobset and paddlejob backends run inside a Kubeflow step; "
                              "use +cluster=prod")
        if cluster.serving.deploy:
            raise ConfigError("cluster.serving.deploy", True, "false when cluster.runner=local",
                              "a local run prints the serve command in its summary; use +cluster=prod to deploy")
        return
    if cluster.backend is ClusterBackend.local:
        raise ConfigError("cluster.backend", cluster.backend.value,
                          "trainjob, jobset or paddlejob when cluster.runner=kubeflow")
    if cluster.submit and not cluster.host:
        raise ConfigError("cluster.host", cluster.host, "the KFP API URL (https://...)",
                          "or cluster.submit=false to only compile the pipeline")
    # Pods share no disk with this machine or with each other: storage must be a remote URL.
    if not is_remote_uri(cfg.checkpoint.uri):
        raise ConfigError("checkpoint.uri", cfg.checkpoint.uri, "a remote fsspec URL (s3://..., hdfs://...) on Kubernetes")
    if cfg.data.source is DataSource.files and not is_remote_uri(cfg.data.uri):
        raise ConfigError("data.uri", cfg.data.uri, "a remote fsspec URL (s3://..., hdfs://...) on Kubernetes")
    if cfg.checkpoint.warm_start and not is_remote_uri(cfg.checkpoint.warm_start):
        raise ConfigError("checkpoint.warm_start", cfg.checkpoint.warm_start, "a remote fsspec URL on Kubernetes")
    for key, image in (("cluster.pipeline_image", cluster.pipeline_image), ("cluster.servers.image", cluster.servers.image),
                       ("cluster.workers.image", cluster.workers.image)):
        if image.digest is not None and not _DIGEST.match(image.digest):
            raise ConfigError(f"{key}.digest", image.digest, "null or sha256:<64 lowercase hex digits>")
    for role, pods in (("servers", cluster.servers), ("workers", cluster.workers)):
        if pods.gpus < 0:
            raise ConfigError(f"cluster.{role}.gpus", pods.gpus, "an integer >= 0")
        if pods.cpu_limit is not None:
            check_cpu(pods.cpu_limit, f"cluster.{role}.cpu_limit", "null or CPUs such as 8 or 500m")
        for i, toleration in enumerate(pods.tolerations):
            if toleration.operator not in ("Exists", "Equal"):
                raise ConfigError(f"cluster.{role}.tolerations[{i}].operator", toleration.operator, "Exists or Equal")
    for key in ("poll_s", "wait_timeout_s"):
        if getattr(cluster, key) <= 0:
            raise ConfigError(f"cluster.{key}", getattr(cluster, key), "seconds > 0")
    if cluster.start_timeout_s <= 0:
        raise ConfigError("cluster.start_timeout_s", cluster.start_timeout_s, "seconds > 0")
    for key in ("run_ttl_s", "run_deadline_s"):
        if getattr(cluster, key) is not None and getattr(cluster, key) < 1:
            raise ConfigError(f"cluster.{key}", getattr(cluster, key), "null or whole seconds >= 1")
    if cluster.max_restarts < 0:
        raise ConfigError("cluster.max_restarts", cluster.max_restarts, "an integer >= 0")
    if cluster.run_as_user < 1:
        raise ConfigError("cluster.run_as_user", cluster.run_as_user, "a user id >= 1 (not root)",
                          "the PS pods and steps run as a non-root user")
    for role, pods in (("servers", cluster.servers), ("workers", cluster.workers)):
        kubernetes_bytes(pods.memory, f"cluster.{role}.memory")
        check_cpu(pods.cpu, f"cluster.{role}.cpu", "a Kubernetes CPU quantity such as 2, 1.5 or 500m")
    if not 1024 <= cluster.paddle_port <= 65535 - 20:
        raise ConfigError("cluster.paddle_port", cluster.paddle_port, "a port in [1024, 65515]")
    if cluster.backend is ClusterBackend.paddlejob and cluster.paddle_port != 36000:
        raise ConfigError("cluster.paddle_port", cluster.paddle_port, "36000 with backend=paddlejob",
                          "paddle-operator's pod services expose ports 36000-36019 only")
    for step, resources in vars(cluster.steps).items():
        _check_step_resources(f"cluster.steps.{step}", resources)
    if cluster.step_retries < 0:
        raise ConfigError("cluster.step_retries", cluster.step_retries, "an integer >= 0")
    if cluster.queue_name is not None and cluster.backend.value not in KUEUE_BACKENDS:
        raise ConfigError("cluster.queue_name", cluster.queue_name, f"null with backend={cluster.backend.value}",
                          f"Kueue queues {' and '.join(KUEUE_BACKENDS)} jobs, not PaddleFlow's PaddleJob")
    for i, cidr in enumerate(cluster.store_egress):
        try:
            ipaddress.ip_network(cidr)
        except ValueError:
            raise ConfigError(f"cluster.store_egress[{i}]", cidr, "a CIDR such as 10.0.0.0/8 or 0.0.0.0/0 (host bits "
                              "zero)", "the pods may reach the store only at these addresses") from None
    for i, secret in enumerate(cluster.storage_secrets):
        if not secret.name or not secret.keys:
            raise ConfigError(f"cluster.storage_secrets[{i}]", {"name": secret.name, "keys": dict(secret.keys)},
                              "a secret name and at least one 'ENV_VAR: secret-key' entry")
    _validate_serving(cfg)


# KServe names the InferenceService's Knative service and hosts after it: a DNS-1035 label, short enough for the
# "-predictor-<revision>" KServe appends.
_SERVING_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,43}[a-z0-9])?$")
_SECRET_NAME = re.compile(r"^[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$")


def _validate_serving(cfg: CtrConfig) -> None:
    """The online server's InferenceService on Kubeflow, checked whether or not it is deployed (its manifest is
    written for review either way)."""
    serving = cfg.cluster.serving
    if not _SERVING_NAME.match(serving.name):
        raise ConfigError("cluster.serving.name", serving.name, "a DNS label of at most 45 characters: lowercase "
                          "letters, digits and '-', starting with a letter (e.g. ctr)")
    if not _SECRET_NAME.match(cfg.export.signing_secret):
        raise ConfigError("export.signing_secret", cfg.export.signing_secret, "a Kubernetes Secret name "
                          "(lowercase letters, digits, '-' and '.')")
    if serving.min_replicas < 1:
        raise ConfigError("cluster.serving.min_replicas", serving.min_replicas, "an integer >= 1",
                          "a replica follows the export store from its start; from zero the first request would "
                          "wait for the table to load")
    if serving.max_replicas < serving.min_replicas:
        raise ConfigError("cluster.serving.max_replicas", serving.max_replicas,
                          f"an integer >= cluster.serving.min_replicas ({serving.min_replicas})")
    _check_step_resources("cluster.serving.resources", serving.resources)
    if serving.resources.gpus:
        raise ConfigError("cluster.serving.resources.gpus", serving.resources.gpus, "0",
                          "the server scores on CPU (the dense program is small; the rows are looked up in memory)")
    _positive("cluster.serving.ready_timeout_s", serving.ready_timeout_s)
    if serving.deploy and cfg.export.format is not ExportFormat.sharded:
        raise ConfigError("export.format", cfg.export.format.value, "sharded with cluster.serving.deploy=true",
                          "the server follows the export store; a single-file export is a pipeline artifact only")
    if serving.deploy and cfg.export.uri is not None and not is_remote_uri(cfg.export.uri):
        raise ConfigError("export.uri", cfg.export.uri, "null or a remote fsspec URL (s3://...) with "
                          "cluster.serving.deploy=true", "the serving pods share no disk with the export step")


def _check_step_resources(key: str, resources: StepResources) -> None:
    for name in ("cpu", "cpu_limit"):
        value = getattr(resources, name)
        if value is not None or name == "cpu":
            check_cpu(value, f"{key}.{name}", "CPUs such as 2, 0.5 or 500m")
    kubernetes_bytes(resources.memory, f"{key}.memory")
    if resources.gpus < 0:
        raise ConfigError(f"{key}.gpus", resources.gpus, "an integer >= 0")
