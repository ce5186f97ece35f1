"""The structured config schema: one dataclass per Hydra config group, closed vocabularies as enums.

Hydra merges the YAML files of ``conf/`` into :class:`CtrConfig`, so a typo in an enum value or a wrong
type fails when the config is composed. :func:`components.config_rules.validate` adds the checks a type cannot
express (counts > 0, mode-specific limits) and runs before any process starts; the inputs themselves are checked
by :mod:`components.data_prep.input_checks`. Components receive the resolved config as a plain dict and rebuild it
with :func:`from_dict`, so the code inside a container sees exactly the same types as the driver.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

from omegaconf import OmegaConf

from components.redaction import redact


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
PsTls = _vocabulary("PsTls", ["auto", "on", "off"],
                    "Mutual TLS on the PS plane between hosts (HAProxy beside each role, a CA per job): on whenever "
                    "roles talk across hosts (auto: compose, Kubernetes without cluster.mesh_encryption), always, or "
                    "never (docs/security.md).")
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
    # Blend the pipeline's fitted baseline (the hashed logistic regression, fitted before training) into the model:
    # the delivered probability is sigmoid(a * network logit + c * regression logit + b), a, b, c fitted on the
    # validation split at each checkpoint in place of eval.calibration's Platt scaling (docs/quality.md).
    blend_baseline: bool = True
    # model=custom: the network, "package.module:function" importable by every process (README: bring your own
    # network; the contract is components.networks.models.NetworkInputs).
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
    # Mutual TLS on every PS connection that leaves a host (components/ps/tls.py); off across hosts is said in the
    # run header and the report.
    tls: PsTls = PsTls.auto
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
    baseline_rows: int = 1_000_000  # the baseline's train rows at most (the first ones): 800k fit in ~15 s on one core
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
    baseline: StepResources = field(default_factory=lambda: StepResources(cpu="2", memory="8Gi"))  # fit-baseline
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
    # same input and data settings, whatever the training keys). Kept in local_cache_root; null: `outputs/.kfp-cache`
    # above the dated run directories, which the runs of every day share (a sweep's jobs: `multirun/.kfp-cache`; a
    # run_dir outside outputs/<date>/: `.kfp-cache` beside it).
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
