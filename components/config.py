"""The structured config schema: one dataclass per Hydra config group, closed vocabularies as enums.

Hydra merges the YAML files of ``conf/`` into :class:`CtrConfig`, so a typo in an enum value or a wrong
type fails when the config is composed. :func:`validate` adds the checks a type cannot express (counts
> 0, paths that exist, mode-specific limits) and runs before any process starts. Components receive the
resolved config as a plain dict and rebuild it with :func:`from_dict`, so the code inside a container
sees exactly the same types as the driver.
"""

from __future__ import annotations

import enum
import ipaddress
import math
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

from omegaconf import OmegaConf

from components.redaction import redact, url_with_password


def _vocabulary(name: str, values: list[str], doc: str) -> type[enum.Enum]:
    """A closed vocabulary whose member names are the config spellings.

    OmegaConf matches enum fields by member *name*, so names must equal what users type
    (``ps.mode=async``); ``async`` is a Python keyword, hence the functional form.
    """
    vocabulary = enum.Enum(name, [(value, value) for value in values], type=str)
    vocabulary.__doc__ = doc
    return vocabulary


Mode = _vocabulary("Mode", ["async", "sync", "geo"],
                   "How workers' updates reach the servers (README: what each mode guarantees).")
DataSource = _vocabulary("DataSource", ["synthetic", "files"], "Where training data comes from.")
FileFormat = _vocabulary("FileFormat", ["raw", "slot", "feasign"],
                         "Criteo Kaggle TSV, PaddleRec CTR-DNN slot text, PaddleRec feasign:slot text.")
ModelName = _vocabulary("ModelName", ["dnn", "wide_deep", "deepfm", "dcn", "custom"],
                        "The CTR model families; custom: a network given by import path (model.network).")
DenseOptimizer = _vocabulary("DenseOptimizer", ["sgd", "adagrad", "adam"],
                             "The optimizer the servers apply to dense parameters.")
TableClass = _vocabulary("TableClass", ["MemorySparseTable", "SSDSparseTable"],
                         "Server-side sparse table implementations: every row in memory, or memory + RocksDB on "
                         "the server's disk (README: hot/cold tables).")
Accessor = _vocabulary("Accessor", ["SparseAccessor"], "Row layouts of the sparse table.")
SparseRule = _vocabulary("SparseRule", ["naive", "adagrad", "std_adagrad", "adam"],
                         "The optimizer rule the servers apply to embedding rows.")
Calibration = _vocabulary("Calibration", ["none", "platt"],
                          "Post-hoc calibration fitted on the validation split (README: calibration).")
ExportDtype = _vocabulary("ExportDtype", ["float32", "float16"],
                          "How the serving export stores the embedding rows (README: float16 exports).")
ExportFormat = _vocabulary("ExportFormat", ["sharded", "single"],
                           "The serving export: the dense program plus id-sorted embedding shards looked up per "
                           "batch (any table size), or one Paddle inference model holding every row (small tables).")
Pooling = _vocabulary("Pooling", ["sum", "mean", "sqrtn"],
                      "How a multi-valued slot's embedding rows become one: their sum, their mean, or their sum over "
                      "the square root of their count.")
DataSplit = _vocabulary("DataSplit", ["random", "ordered"],
                        "How rows go to the train, validation and test splits: by a hash of where each row is, or the "
                        "validation and test splits from the end of the input in file order (README: honest splits).")
PipelineRunner = _vocabulary("PipelineRunner", ["local", "kubeflow"],
                             "Where the pipeline's steps run: kfp.local on this machine, or Kubeflow Pipelines.")
Compression = _vocabulary("Compression", ["none", "snappy", "gzip", "zlib", "lz4"],
                          "How a PS client compresses its requests (brpc's lossless codecs; README: choosing a mode "
                          "for your network).")
ClusterBackend = _vocabulary("ClusterBackend", ["local", "trainjob", "jobset", "paddlejob"],
                             "How the train step starts the PS processes: local subprocesses, a Kubeflow Trainer "
                             "TrainJob, a JobSet, or a PaddleJob of PaddleFlow's paddle-operator (README: which "
                             "backend to pick).")


@dataclass
class DriftConfig:
    """How far a day may move from the day before (README: drift checks). A larger shift is a warning on the
    console and in the report; a day with no clicks, or a slot present the day before and missing in every row now,
    stops the run before training (a broken log pipeline must not train the model) unless allowed."""

    max_rows_change: float = 0.5  # |rows / previous rows - 1|
    max_ctr_change: float = 0.25  # |ctr / previous ctr - 1|
    max_new_id_change: float = 0.2  # |new-id fraction - previous new-id fraction|, per slot
    max_missing_change: float = 0.2  # |missing fraction - previous missing fraction|, per slot
    allow_no_clicks: bool = False
    allow_missing_slot: bool = False


@dataclass
class DataConfig:
    source: DataSource = DataSource.synthetic
    rows: int = 400_000  # synthetic only: rows generated (train, validation and test together)
    uri: Optional[str] = None  # files only: a path, glob or fsspec URL (s3://...) of the input files
    format: FileFormat = FileFormat.raw
    slots: Optional[list[str]] = None  # feasign only: the sparse slots to keep (None = all seen)
    test_fraction: float = 0.2
    # The validation split the train step scores after every checkpoint: it keeps the best checkpoint, stops early
    # and fits the calibration on it (0: none, the last checkpoint is delivered).
    valid_fraction: float = 0.1
    shards_per_worker: int = 1
    max_malformed_fraction: float = 0.01
    seed: int = 0
    # Data prep fans out over this many convert tasks (pods on Kubeflow), each a pool of prep_processes
    # processes (null: every core the task may use). The dataset is the same whatever both are.
    prep_parallelism: int = 1
    prep_processes: Optional[int] = None
    # Validation and test rows: a hash of where each row is (random), or the end of the input in file order.
    split: DataSplit = DataSplit.random
    # Day-partitioned input (components/days.py): data.uri holds a {day} placeholder, and the run trains these
    # days in order, each continuing the checkpoint store ("<first>..<last>" is a range of dates or integers).
    days: Optional[list[str]] = None
    # The one day a pipeline run trains: set per run from data.days; on Kubeflow the `day` run parameter, or a
    # recurring run's scheduled time minus day_lag days, formatted with day_format.
    day: Optional[str] = None
    day_format: str = "%Y-%m-%d"
    day_lag: int = 1
    drift: DriftConfig = field(default_factory=DriftConfig)
    # Ids of a sparse slot seen in fewer train rows than this map to one out-of-vocabulary id of that slot (1: off).
    min_id_count: int = 1
    # Negative downsampling: the train split keeps this fraction of its negatives, chosen by a hash of each row
    # (deterministic); predictions are corrected by q = p / (p + (1 - p) / rate) wherever they are used.
    negative_sample_rate: float = 1.0
    # Per-row importance weights: raw format, a 0-based column after Criteo's 40 (e.g. "40"); slot and feasign
    # formats, a slot name (weight:2.5). Every weight must be a non-negative number; it scales the loss and metrics.
    weight_column: Optional[str] = None


@dataclass
class ModelConfig:
    name: ModelName = ModelName.dnn
    hidden: list[int] = field(default_factory=lambda: [256, 128])
    optimizer: DenseOptimizer = DenseOptimizer.adam
    learning_rate: float = 0.001  # of the dense parameters (model.optimizer)
    dropout: float = 0.0  # on every hidden layer's output, while training
    embedding_l2: float = 0.0  # L2 penalty on the embedding rows a batch looks up (their gradient reaches the servers)
    cross_layers: int = 3  # dcn: cross layers beside the deep tower
    pooling: Pooling = Pooling.sum  # of a multi-valued slot's rows
    # model=custom: the network, "package.module:function" importable by every process (README: bring your own
    # network; the contract is components.ps.models.NetworkInputs).
    network: Optional[str] = None
    # model=custom: Paddle op types its inference program holds beyond the built-in families' (the export refuses to
    # load any other op); recorded in the signed serving.json.
    extra_ops: list[str] = field(default_factory=list)


@dataclass
class EvictionConfig:
    """Evict rows from the servers at every checkpoint (Paddle's CTR accessor shrink).

    First show and click decay (x ``show_click_decay_rate``); then a row goes if its score
    ``(show - click) * nonclk_coeff + click * click_coeff`` is under ``delete_threshold``, or if it was not
    trained for more than ``delete_after_unseen_days`` days. With day partitions (``data.days``) a day is a day: the
    day's first checkpoint decays, evicts and ages every row by one, training resets it. Without them a "day" is one
    checkpoint: every save ages and every checkpoint evicts.
    """

    enabled: bool = False
    show_click_decay_rate: float = 1.0
    delete_threshold: float = 0.0
    delete_after_unseen_days: int = 30
    nonclk_coeff: float = 1.0
    click_coeff: float = 1.0


@dataclass
class AdmissionConfig:
    """When a new id gets its embedding: a row keeps only its first-order weight until its score
    ``(show - click) * nonclk_coeff + click * click_coeff`` (its shows, with the default coefficients) reaches
    ``embedx_threshold`` (Paddle's SparseAccessor embedx_threshold; 0: at once)."""

    embedx_threshold: float = 0.0


@dataclass
class TableConfig:
    table_class: TableClass = TableClass.MemorySparseTable
    accessor: Accessor = Accessor.SparseAccessor
    # Feature ids are hashed into [0, vocab_size). A geo worker keeps a dense local copy of this size.
    vocab_size: int = 1 << 20
    embedding_dim: int = 9  # floats per embedding row (1 first-order weight + embedding_dim - 1 factors)
    # Hash shards of the table (a row lives in shard id % shard_num; each server owns a block of them).
    # null: 8 per server, or what a restored checkpoint was saved with (components/train/planner.py).
    shard_num: Optional[int] = None
    rule: SparseRule = SparseRule.adagrad
    learning_rate: float = 0.05  # of the embedding rows (table.rule, applied on the servers)
    initial_range: float = 1e-4
    initial_g2sum: float = 3.0
    weight_bounds: list[float] = field(default_factory=lambda: [-10.0, 10.0])
    eviction: EvictionConfig = field(default_factory=EvictionConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)


@dataclass
class PsConfig:
    mode: Mode = Mode["async"]
    servers: int = 2  # processes (pods) holding the sparse table's shards
    workers: int = 2  # processes (pods) training on their share of the data
    threads: int = 1  # reader/trainer threads per worker
    batch_size: int = 256  # examples per batch of a worker thread
    epochs: int = 1  # at most: with a validation split the job stops earlier once it stops improving
    # Checkpoints in a row whose validation objective is not the best so far before the job stops (early stopping).
    patience: int = 2
    geo_k_steps: int = 100  # geo: local steps between delta pushes
    sync_batches: int = 16  # sync: batches per worker between global barriers
    host: str = "127.0.0.1"  # local backend: the address every role binds and dials
    # The local backend's PS plane is plaintext and answers any peer: a ps.host other than loopback is refused
    # unless this is true (then with one warning).
    allow_external_bind: bool = False
    # Every role reports (progress, or a heartbeat) this often.
    progress_period_s: float = 5.0
    # How long the servers may take to come up (rendezvous store, PS ports) before the job fails.
    startup_timeout_s: float = 120.0
    # A role that reports nothing for this long (stopped, hung) fails the job, naming it. A worker waiting in a
    # barrier for a slower one is not counted as stalled. Shorter stalls (a 20 s stop, a network blip) pass.
    stall_timeout_s: float = 120.0
    # Paddle's PS RPC settings (brpc gflags FLAGS_pserver_*), set for network blips (docs/operations.md, the fault
    # matrix). A deadline per RPC: long enough for a pull that waits behind a server's save of a large table; a role
    # that hangs is caught sooner by ps.stall_timeout_s.
    rpc_timeout_ms: int = 600_000
    # A deadline per connection attempt. Paddle's client tries a connection 4 times (its max_retry of 3 is fixed in
    # the wheel), so 30 s carries a 60 s cut of a link: measured, 10 s (Paddle's default) failed one RPC for good
    # after 40 s of a 60 s cut (its gradient lost); a dead server refuses at once, whatever this value.
    rpc_connect_timeout_ms: int = 30_000
    # How often a server retries saving a table.
    table_save_max_retry: int = 3
    # Batches whose gradients a worker sums into one push of each table. Paddle's client merges about 13 (its
    # push_dense/push_sparse merge limits of 12): the servers' optimizers then step once per 13 batches with the
    # summed gradient, which leaves Adam's dense weights and the Adagrad rows far behind; 1 pushes every batch
    # (bench/results/criteo_defaults.md). Larger values trade that for fewer RPCs on a big cluster.
    batches_per_push: int = 1
    # The codec of the workers' requests to the servers (Paddle's FLAGS_pserver_communicate_compress_type): lossless,
    # it trades the workers' and servers' CPU for bytes on a short link (README: choosing a mode for your network).
    compress: Compression = Compression.none
    # GiB (2^30 bytes) one server may hold; a sparse table whose plan exceeds it is refused before the job
    # starts. null: the server pods' memory (cluster.servers.memory) on Kubernetes, no check locally.
    memory_budget_gb: Optional[float] = None


@dataclass
class CheckpointConfig:
    uri: str = "checkpoint"  # fsspec URL of the checkpoint store: a path, s3://bucket/prefix, hdfs://...
    every_passes: int = 1  # commit a checkpoint after every N passes; the last pass is always committed
    # Also commit one inside a pass once this many minutes passed since the last (0 = off). A pass is then
    # trained in chunks of chunk_batches batches per worker, and a checkpoint falls between two chunks.
    every_minutes: float = 0.0
    chunk_batches: int = 256
    # Also commit (and validate) a checkpoint every N batches per worker inside a pass (0 = off).
    every_batches: int = 0
    keep_last: int = 3  # committed checkpoints kept in the store (older ones are pruned)
    # Where training continues from: none; latest (the store must hold a checkpoint); auto (latest if there is
    # one, else a fresh start); or a checkpoint id.
    resume: str = "none"
    # Start from another run's weights when this store has nothing to resume: "<store uri>" (its latest
    # checkpoint) or "<store uri>#<checkpoint id>". Training starts at pass 1.
    warm_start: Optional[str] = None


@dataclass
class ExportConfig:
    format: ExportFormat = ExportFormat.sharded
    # The dtype of the serving export's embedding rows. float16 halves them; checkpoints keep the servers' own
    # float32 table files, so resume stays exact either way.
    dtype: ExportDtype = ExportDtype.float32
    # The export store: every export is a version there (a base, or a delta on the version before it).
    # null: "<checkpoint.uri>-serving", so runs continuing one checkpoint store continue one chain of exports.
    uri: Optional[str] = None
    # A new base after this many deltas (0: every export is a base).
    base_every: int = 8
    # The private key that signs each export's serving.json (components/export/signing.py), which loaders check:
    # auto (a per-user key pair under ~/.config/paddle-ps-pipelines/export-signing, made on first use; on
    # Kubeflow the Secret signing_secret's key.pem), a PEM PKCS#8 EC P-256 key file, or none (unsigned exports,
    # which loaders refuse unless told --allow-unsigned).
    signing_key: str = "auto"
    # Kubeflow: the Secret (keys key.pem and key.pub) mounted into the export step when signing_key is auto; an
    # online server (cluster.serving) mounts key.pub alone, to verify what it loads.
    signing_secret: str = "ctr-export-signing"


@dataclass
class EvalConfig:
    roc_points: int = 200
    calibration_bins: int = 10
    calibration: Calibration = Calibration.platt  # fitted on the validation split, applied in evaluation and serving
    baseline: bool = True  # also train and score a hashed logistic regression on the same shards
    baseline_rows: int = 1_000_000  # the baseline's train rows at most (the first ones): ~20 s on one core
    # The baseline's weights at most: ids are hashed into this many buckets, so its memory is bounded whatever
    # the table's size.
    baseline_features: int = 1 << 22
    # The decision threshold of the confusion matrix (predicted click when p >= threshold).
    # null: the training split's CTR, the base rate a calibrated model's predictions scatter around.
    threshold: Optional[float] = None
    # The pipeline exports the serving model only when the test AUC is at least this (0: always).
    min_auc: float = 0.0
    # Grouped AUC (GAUC): the AUC per value of this sparse slot (a user or ad id), weighted by the group's
    # impressions; groups with one class are skipped and counted.
    group_by: Optional[str] = None
    # A per-slice table for the top slice_top values of this sparse slot: rows, CTR, AUC, calibration.
    slices: Optional[str] = None
    slice_top: int = 10


# The image every pipeline step and PS pod runs unless the cluster config names another (containers/Dockerfile).
DEFAULT_IMAGE = "paddle-ps-pipelines:0.1.0"


@dataclass
class ImageConfig:
    name: str = DEFAULT_IMAGE
    digest: Optional[str] = None  # "sha256:<64 hex>": when set, pods pull name@digest

    @property
    def reference(self) -> str:
        return f"{self.name.split('@')[0]}@{self.digest}" if self.digest else self.name


@dataclass
class Toleration:
    key: str = ""
    operator: str = "Exists"
    value: Optional[str] = None
    effect: Optional[str] = None


@dataclass
class PodConfig:
    """Pods of one PS role on Kubernetes."""

    image: ImageConfig = field(default_factory=ImageConfig)
    cpu: str = "2"
    memory: str = "8Gi"
    # null: no CPU limit (throttling a PS server stalls every worker); set one where a quota requires limits.
    cpu_limit: Optional[str] = None
    gpus: int = 0  # nvidia.com/gpu per pod; a worker with gpus > 0 trains on its GPU
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[Toleration] = field(default_factory=list)


@dataclass
class SecretEnv:
    """A Kubernetes secret exposed to the steps and PS pods as environment variables (``env var: secret key``)."""

    name: str = ""
    keys: dict[str, str] = field(default_factory=dict)


@dataclass
class StepResources:
    """What one pipeline step's pod requests and is limited to (quota-enforced namespaces require both)."""

    cpu: str = "1"  # request
    cpu_limit: Optional[str] = None  # null: the request
    memory: str = "2Gi"  # request and limit
    gpus: int = 0  # nvidia.com/gpu; the steps' own code runs on CPU (the PS workers' GPUs are cluster.workers.gpus)


@dataclass
class StepsConfig:
    """The pipeline steps' pods on Kubeflow, by step."""

    resolve: StepResources = field(default_factory=lambda: StepResources(cpu="500m", memory="1Gi"))
    prepare: StepResources = field(default_factory=lambda: StepResources(cpu="2", memory="8Gi"))
    train: StepResources = field(default_factory=lambda: StepResources(cpu="1", memory="2Gi"))  # the launcher
    evaluate: StepResources = field(default_factory=lambda: StepResources(cpu="2", memory="8Gi"))
    export: StepResources = field(default_factory=lambda: StepResources(cpu="1", memory="4Gi"))


@dataclass
class ServingConfig:
    """The online server on Kubeflow: a KServe InferenceService that the pipeline creates or updates after the
    export (components/deploy), running ``python -m components.export.serving serve`` on the export store."""

    deploy: bool = False  # end the pipeline by creating or updating the InferenceService (export.format=sharded)
    name: str = "ctr"  # the InferenceService's name and the served model's (/v1/models/<name>:predict)
    min_replicas: int = 1
    max_replicas: int = 1
    # The replica's pod: CPU request (and limit), memory request and limit. The memory is the larger of this and
    # the planner's serving plan (components/train/process_plan.py serving_process) with its margin.
    resources: StepResources = field(default_factory=lambda: StepResources(cpu="1", memory="1Gi"))
    ready_timeout_s: float = 900.0  # the deploy step fails when the InferenceService is not Ready by then


@dataclass
class ClusterConfig:
    runner: PipelineRunner = PipelineRunner.local
    backend: ClusterBackend = ClusterBackend.local
    # A local run's step cache (kfp.local): a step whose inputs did not change reuses its outputs (data prep of the
    # same input and data settings, whatever the training keys). Kept in local_cache_root; null: `.kfp-cache` beside
    # the run directory, which the runs of one day (outputs/<date>/) and the jobs of a sweep share.
    local_cache: bool = True
    local_cache_root: Optional[str] = None
    # Kubeflow Pipelines (runner=kubeflow)
    host: Optional[str] = None  # the KFP API endpoint, e.g. https://kubeflow.example.com/pipeline
    namespace: str = "kubeflow"
    experiment: str = "ctr-ps"
    pipeline_root: Optional[str] = None  # where KFP keeps artifacts (s3://...); None = the KFP default
    submit: bool = True  # false: only compile the pipeline YAML (to upload in the Kubeflow UI)
    # A cron expression (KFP's six fields, seconds first: "0 0 2 * * *"): create a recurring run, one run per
    # day, that trains the day named by its scheduled time (data.day_format, data.day_lag) on a {day} data.uri.
    schedule: Optional[str] = None
    # A Kubeflow run's hygiene (dsl.PipelineConfig): its pods and their logs are deleted this long after it
    # finished, and a run still going after run_deadline_s is stopped (null: never).
    run_ttl_s: Optional[int] = 7 * 24 * 3600
    run_deadline_s: Optional[int] = 48 * 3600
    # Wait for the submitted run to end and return its objective (sweeps with adaptive sweepers need it).
    wait: bool = False
    poll_s: float = 30.0
    wait_timeout_s: float = 48 * 3600.0
    # The account the steps' pods run as (the run's): a plain one, such as a Kubeflow profile's default-editor.
    pipeline_service_account: str = "default-editor"
    # The account that may create PS jobs (k8s/rbac.yaml): only the train step acts as it, through its token.
    service_account: str = "ctr-ps-launcher"
    pipeline_image: ImageConfig = field(default_factory=ImageConfig)
    steps: StepsConfig = field(default_factory=StepsConfig)
    # Retries of the steps that can simply run again (prepare, evaluate, export), with a growing back-off.
    step_retries: int = 2
    image_pull_secrets: list[str] = field(default_factory=list)  # secret names, for the steps and the PS pods
    # The PS job's pods (backend=trainjob | jobset | paddlejob)
    servers: PodConfig = field(default_factory=PodConfig)
    workers: PodConfig = field(default_factory=PodConfig)
    storage_secrets: list[SecretEnv] = field(default_factory=list)
    max_restarts: int = 2  # whole-job restarts from the last committed checkpoint before the step fails
    # No pod of the PS job running after this long (image pulls, scheduling) fails the step with the reasons.
    start_timeout_s: float = 1800.0
    paddle_port: int = 36000  # every PS pod listens here; server 0 serves the gloo store on port + 18
    network_policy: bool = True  # the job's pods talk to each other, DNS and the store only (both directions)
    # Where the pods may reach the store (CIDRs) when its URLs name no IP address (s3://bucket: the endpoint comes
    # from the storage secret). The cloud metadata address 169.254.169.254 stays blocked whatever is listed.
    store_egress: list[str] = field(default_factory=lambda: ["0.0.0.0/0"])
    mesh_encryption: bool = False  # opt in to Istio ambient mode (ztunnel mTLS, no sidecars) for PS traffic
    run_as_user: int = 1000
    queue_name: Optional[str] = None  # a Kueue LocalQueue: the TrainJob or JobSet waits there for quota
    # The cosign public key (PEM file on the compiling machine) the images are signed with: when set, the run
    # directory gets k8s/image-policy.yaml, a sigstore policy-controller policy admitting only signed images.
    image_signing_key: Optional[str] = None
    serving: ServingConfig = field(default_factory=ServingConfig)


@dataclass
class CtrConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    table: TableConfig = field(default_factory=TableConfig)
    ps: PsConfig = field(default_factory=PsConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    run_dir: str = "."
    objective: str = "auc"
    # Print what the run would do (data, shards, memory plan, processes, checkpoint store) and start nothing.
    plan: bool = False
    verbose: bool = False  # every line of every step on the console, not only in the run's log file


class ConfigError(ValueError):
    """A config value that cannot work: names the key, the value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str, hint: str = ""):
        # Redacted: a URL's password or a credential's value is never echoed (nor kept for a caller to print).
        self.key, self.value = key, redact(value) if isinstance(value, str) else value
        message = f"config key '{key}' has value {self.value!r}; allowed: {allowed}"
        super().__init__(redact(message + (f". {hint}" if hint else "")))


# Tells apart runs started in the same second: ``${run_token:}`` in conf/config.yaml's run and sweep directories.
RUN_TOKEN = uuid.uuid4().hex[:6]


def register_configs() -> None:
    """Register the schema so that ``conf/config.yaml`` can name it first in its defaults list, and the
    ``run_token`` resolver its run directories use."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="ctr_schema", node=CtrConfig)
    if not OmegaConf.has_resolver("run_token"):
        OmegaConf.register_new_resolver("run_token", lambda: RUN_TOKEN)


def ints_from_struct(value: Any) -> Any:
    """Undo what a protobuf Struct (a KFP dict parameter, artifact metadata) does to ints: ``2`` -> ``2.0``.

    Integral floats go back to ints; a float field takes the int as well, an int field refuses ``2.0``.
    """
    if isinstance(value, dict):
        return {k: ints_from_struct(v) for k, v in value.items()}
    if isinstance(value, list):
        return [ints_from_struct(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def from_dict(raw: Any) -> CtrConfig:
    """Rebuild a typed config from a resolved dict (what components receive) or a DictConfig."""
    if isinstance(raw, dict):
        raw = ints_from_struct(raw)
    merged = OmegaConf.merge(OmegaConf.structured(CtrConfig), raw)
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


T = TypeVar("T")


def section_from_dict(section: type[T], raw: Any) -> T:
    """One typed section (``ModelConfig``, ``TableConfig``, ...) from its dict: what a checkpoint records of the model
    and the table it was trained with, read without building a whole config."""
    if isinstance(raw, dict):
        raw = ints_from_struct(raw)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(section), raw))  # type: ignore[return-value]


def to_dict(cfg: CtrConfig) -> dict:
    """The JSON-safe form passed to components (enums as their values)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)  # type: ignore


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?|\.[0-9]+)([KMGTPE]i?|k)?$")
_UNITS = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
          "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_CPU = re.compile(r"^([0-9]+(?:\.[0-9]+)?|\.[0-9]+)m?$")


def kubernetes_bytes(quantity: str, key: str = "cluster.servers.memory") -> float:
    """A Kubernetes memory quantity in bytes: a number with an optional suffix (``8Gi``, ``512M``)."""
    match = _QUANTITY.match(str(quantity).strip())
    if not match:
        raise ConfigError(key, quantity, "a Kubernetes memory quantity such as 8Gi or 8000M")
    return float(match[1]) * _UNITS[match[2] or ""]


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


def validate(cfg: CtrConfig, check_storage: bool = True) -> None:
    """Checks beyond types; raises :class:`ConfigError` before anything expensive starts.

    ``check_storage=False`` skips listing ``data.uri``: a driver submitting to Kubeflow may hold no
    credentials for the cluster's storage; the run's first step checks it with the cluster's.
    """
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
    elif check_storage:
        for uri, day in _uris_to_check(cfg):
            _check_data_uri(cfg.data, uri, day)
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


def _check_sampled_weights(data: DataConfig, path: str, head: bytes, of_day: str) -> None:
    """Every whole line of ``head`` (the first bytes of the first input file) that holds Criteo's fields (raw) or
    any token has a weight where data.weight_column says, a finite number >= 0: a wrong column fails here, before
    data prep reads the input."""
    column = data.weight_column
    lines = head.split(b"\n")
    for number, raw in enumerate(lines[:-1] if len(head) == SNIFF_BYTES else lines, 1):  # the last may be cut
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if data.format is FileFormat.raw:
            fields = line.split("\t")
            if len(fields) < RAW_FIELDS:  # a malformed line: data prep counts it
                continue
            found = fields[int(column):int(column) + 1]
        else:
            if not line.split():
                continue
            found = [token.partition(":")[2] for token in line.split() if token.startswith(f"{column}:")]
        problem = _weight_problem(found)
        if problem:
            raise ConfigError("data.weight_column", column, "where every row's weight is, a finite number >= 0",
                              f"{of_day}{path}:{number} has {problem}")


def _weight_problem(found: list[str]) -> str:
    """What is wrong with a sampled row's weight (``found``: the texts where weights are), "" if nothing."""
    if len(found) > 1:
        return f"{len(found)} weights"
    if not found or not found[0]:
        return "no weight"
    try:
        weight = float(found[0])
    except ValueError:
        weight = math.nan
    return "" if math.isfinite(weight) and weight >= 0 else f"weight {found[0]!r}, not a finite number >= 0"


def _refuse_restore(cfg: CtrConfig, condition: str, why: str) -> None:
    """Jobs whose servers keep no loadable table: nothing may be restored into them."""
    for key, value, unset in (("checkpoint.resume", cfg.checkpoint.resume, "none"),
                              ("checkpoint.warm_start", cfg.checkpoint.warm_start, None)):
        if value != unset:
            raise ConfigError(key, value, f"{unset!r} {condition}", why)


_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Kubernetes quantities in the forms KFP accepts for a step's resources (kfp.dsl.PipelineTask).
_CPU = re.compile(r"^([0-9]*[.])?[0-9]+m?$")
_MEMORY = re.compile(r"^[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$")
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
        if pods.cpu_limit is not None and not _CPU.match(pods.cpu_limit):
            raise ConfigError(f"cluster.{role}.cpu_limit", pods.cpu_limit, "null or CPUs such as 8 or 500m")
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
        if not _CPU.match(str(pods.cpu).strip()):
            raise ConfigError(f"cluster.{role}.cpu", pods.cpu, "a Kubernetes CPU quantity such as 2, 1.5 or 500m")
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
        if (value is not None or name == "cpu") and not _CPU.match(str(value)):
            raise ConfigError(f"{key}.{name}", value, "CPUs such as 2, 0.5 or 500m")
    if not _MEMORY.match(resources.memory):
        raise ConfigError(f"{key}.memory", resources.memory, "bytes such as 4Gi, 512Mi or 8G")
    if resources.gpus < 0:
        raise ConfigError(f"{key}.gpus", resources.gpus, "an integer >= 0")


# How much of the first input file is read to tell text from binary (an image, a Parquet file, a model).
SNIFF_BYTES = 4096


def _uris_to_check(cfg: CtrConfig) -> list[tuple[Optional[str], Optional[str]]]:
    """``(uri, day)`` of every input a run reads: each of its days' (None: the one ``data.uri``); none for a
    recurring run, whose day is known when it runs (its first step checks it)."""
    from components.days import day_uri, expand_days, is_daily

    data = cfg.data
    if not is_daily(data.uri):
        return [(data.uri, None)]
    days = [str(data.day)] if data.day is not None else expand_days(data.days or [])
    return [(day_uri(data.uri, day), day) for day in days]  # type: ignore[arg-type]


def _check_data_uri(data: DataConfig, uri: Optional[str], day: Optional[str] = None) -> None:
    """The input exists, holds bytes, and is text; ``day``: the day whose input ``uri`` is (errors name it)."""
    key, of_day = ("data.days", f"day {day!r}: ") if day is not None else ("data.uri", "")
    if not uri:
        raise ConfigError("data.uri", uri, "a path, glob or fsspec URL of the input files",
                          "set data.uri=... when data=criteo")
    import fsspec
    from fsspec.utils import infer_compression

    try:
        fs, _, paths = fsspec.get_fs_token_paths(uri)
        found = [p for p in paths if fs.exists(p)]
    except Exception as err:  # an unknown protocol or an unreachable store
        raise ConfigError(key, uri, "an existing path, glob or fsspec URL", f"{of_day}cannot list it: {err}")
    if not found:
        raise ConfigError(key, uri, "an existing path, glob or fsspec URL", f"{of_day}nothing matches it")
    files = [p for p in found if fs.isfile(p)] or [p for d in found for p in fs.find(d)]
    if not any(fs.size(p) for p in files):
        raise ConfigError(key, uri, "input files holding rows", f"{of_day}every file it names is empty"
                          + (" (a day whose logs did not arrive?)" if day is not None else ""))
    first = next(iter(files), None)
    if first is not None:
        with fs.open(first, "rb", compression=infer_compression(first)) as head:
            sniffed = head.read(SNIFF_BYTES)
        if b"\0" in sniffed:  # every data.format is text: a NUL byte means another kind of file
            raise ConfigError(key, uri, f"text files in data.format={data.format.value}",
                              f"{of_day}{first} is binary (a NUL byte in its first {SNIFF_BYTES} bytes); point data.uri "
                              "at the TSV or text files (compressed ones may end in .gz, .bz2, ...)")
        if data.weight_column is not None:
            _check_sampled_weights(data, first, sniffed, of_day)
