"""Compile the pipeline for Kubeflow Pipelines, submit a run and, with ``cluster.wait``, wait for its objective
(``python -m pipelines.ctr +cluster=prod``).

With day partitions (``data.uri`` holding ``{day}``) a run trains one day: ``data.day=<d>`` submits the run of that
day; ``data.days=[...]`` submits one run per day, in order, each once the day before has ended (they continue one
checkpoint store, which learns its days in order); ``cluster.schedule=<cron>`` creates a recurring run instead, each
of whose runs trains the day its scheduled time names (:func:`components.resolve.step.with_run_day`).

The run directory gets::

    pipeline.yaml       the compiled pipeline (IR YAML + Kubernetes platform spec): submitted, or to upload
    config.yaml         the config compiled into it (storage credentials appear only as secret names)
    k8s/rbac.yaml       the launcher account the train step and the exit handler act as, and what it may do
                        (``kubectl apply -f``, once)
    k8s/ps-job.yaml     the objects the train step will create, for review (``kubectl apply --dry-run=server -f``)
    k8s/inference-service.yaml  the online server's KServe InferenceService, for review; with
                        cluster.serving.deploy the pipeline's last step creates or updates it
    k8s/image-policy.yaml  with cluster.image_signing_key: admit only images signed with that key
    kubeflow_run.json   after a submission: the run id, its URL, the experiment and the run parameters
    kubeflow_runs.json  with data.days: the runs submitted so far, one per day, in order
    kubeflow_recurring_run.json  with cluster.schedule: the recurring run's id, its URL, its cron and parameters
    metrics.json        with cluster.wait, after the run succeeded: its test metrics (as a local run writes)

A submission that fails (host unreachable, DNS, an HTTP error) raises :class:`SubmitError`, whose one-line
message says what failed, where, and where the compiled pipeline is, to upload it by hand. A run waited for
that ends without an objective raises :class:`RunError`, naming the run, its URL and why.
"""

import datetime as dt
import json
import re
import socket
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import kfp
import urllib3
import yaml
from omegaconf import OmegaConf

from components.config import ConfigError, CtrConfig, to_dict
from components.days import expand_days, is_daily
from components.resolve.step import RUN_PARAMETERS, run_parameters
from pipelines.pipeline import PIPELINE_NAME, compile_pipeline, compiled_config
from pipelines.result import RunResult

PIPELINE_FILE = "pipeline.yaml"
CONFIG_FILE = "config.yaml"
RBAC_FILE = "k8s/rbac.yaml"
PS_JOB_FILE = "k8s/ps-job.yaml"
INFERENCE_SERVICE_FILE = "k8s/inference-service.yaml"
IMAGE_POLICY_FILE = "k8s/image-policy.yaml"
RUN_FILE = "kubeflow_run.json"
DAY_RUNS_FILE = "kubeflow_runs.json"
RECURRING_RUN_FILE = "kubeflow_recurring_run.json"
METRICS_FILE = "metrics.json"
# KFP's default artifact store (MinIO) when no cluster.pipeline_root is given.
DEFAULT_PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"
# Per socket operation: a host that drops packets fails in seconds, not after the OS's connect timeout.
API_TIMEOUT_S = 30.0
# v2beta1 run states after which a run does not change any more.
FINAL_STATES = ("SUCCEEDED", "SKIPPED", "FAILED", "CANCELED")
# Polls in a row that may fail before the wait gives up: a wait of hours should outlive an API server restart.
POLL_FAILURES_TOLERATED = 10


class SubmitError(RuntimeError):
    """Submitting the compiled pipeline to Kubeflow Pipelines failed."""


class RunError(SubmitError):
    """A run that was waited for ended without an objective: not SUCCEEDED, not within ``cluster.wait_timeout_s``,
    or without an evaluation of its own. A :class:`SubmitError`, so the command reports it the same way."""


@dataclass
class SubmittedRun:
    run_id: str
    url: str
    host: str
    namespace: str
    experiment: str
    experiment_id: str
    run_name: str
    submitted_at: str  # UTC, ISO 8601, taken before the run was created: its checkpoints are all younger
    service_account: str
    parameters: dict
    pipeline: str  # the compiled YAML that was submitted


@dataclass
class RecurringRun:
    recurring_run_id: str
    url: str
    host: str
    namespace: str
    experiment: str
    experiment_id: str
    name: str
    cron: str
    created_at: str  # UTC, ISO 8601
    service_account: str
    parameters: dict  # day "": each run takes its day from its scheduled time
    pipeline: str  # the compiled YAML it runs


class _FailFastClient(kfp.Client):
    """``kfp.Client`` that reports the first failed answer.

    The stock client retries its health check 5 times 5 s apart, and every request 3 times; for a host that
    cannot be reached that only delays the error. Without retries a request that may have reached the
    server is never sent again either, so a run cannot be created twice.
    """

    def _load_config(self, *args, **kwargs):
        config = super()._load_config(*args, **kwargs)
        config.retries = urllib3.Retry(connect=0, read=0)
        return config

    def get_kfp_healthz(self, sleep_duration: int = 5):
        return self._healthz_api.healthz_service_get_healthz()


class _PlainDumper(yaml.SafeDumper):
    """Writes a list the manifests share as often as it occurs, not as a YAML anchor and aliases."""

    def ignore_aliases(self, data) -> bool:
        return True


def review_data_uri(cfg: CtrConfig) -> str:
    """Where a run's Dataset artifact will be: under the pipeline root, at names only the run gives."""
    root = (cfg.cluster.pipeline_root or DEFAULT_PIPELINE_ROOT).rstrip("/")
    return f"{root}/{PIPELINE_NAME}/<run id>/merge-data/<execution id>/dataset"


def write_run_files(cfg: CtrConfig, run_dir: Path) -> Path:
    """Compile the pipeline and write the run directory's files; returns the pipeline YAML's path."""
    from components.deploy.inference_service import inference_service
    from components.train.backends.image_policy import job_image_policy, to_yaml
    from components.train.backends.manifests import REVIEW_NAME, review_manifests
    from components.train.backends.rbac import launcher_rbac

    image_policy = job_image_policy(cfg)  # reads the signing key: a bad one fails before anything is compiled
    run_dir.mkdir(parents=True, exist_ok=True)
    pipeline_path = Path(compile_pipeline(cfg, run_dir / PIPELINE_FILE))
    (run_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(compiled_config(cfg)))))
    (run_dir / "k8s").mkdir(exist_ok=True)
    header = (f"# The launcher account and what it may do: kubectl apply -f {RBAC_FILE}, once per namespace. The last\n"
              "# two documents are cluster-scoped (a cluster admin applies them; Kubernetes >= 1.30): an admission\n"
              "# policy that lets the account create and delete PS job objects only, which RBAC cannot say.\n")
    (run_dir / RBAC_FILE).write_text(header + yaml.dump_all(launcher_rbac(cfg), Dumper=_PlainDumper, sort_keys=False))
    header = (f"# The objects the train step creates (cluster.backend={cfg.cluster.backend.value}), for review: e.g.\n"
              f"#   kubectl apply --dry-run=server -f {PS_JOB_FILE}\n"
              f"# A run differs in what only it decides: the name ({REVIEW_NAME} here, <run>-<random> in a run), the\n"
              "# dataset URI (the run's Dataset artifact), a checkpoint.resume target and the ownerReferences (the\n"
              "# train step's pod).\n")
    objects = review_manifests(compiled_config(cfg), review_data_uri(cfg))  # the config the train step gets
    (run_dir / PS_JOB_FILE).write_text(header + yaml.dump_all(objects, Dumper=_PlainDumper, sort_keys=False))
    deployed = ("the pipeline's deploy-model step creates or updates it after each export that passes the AUC gate"
                if cfg.cluster.serving.deploy else "cluster.serving.deploy=true makes the pipeline create or update it")
    header = (f"# The online server, for review ({deployed}): e.g.\n"
              f"#   kubectl apply --dry-run=server -f {INFERENCE_SERVICE_FILE}\n"
              "# The deploy step writes it in its own pod's namespace.\n")
    service = inference_service(cfg, cfg.cluster.namespace)
    (run_dir / INFERENCE_SERVICE_FILE).write_text(header + yaml.dump(service, Dumper=_PlainDumper, sort_keys=False))
    if image_policy:
        (run_dir / IMAGE_POLICY_FILE).write_text(to_yaml(image_policy))
    return pipeline_path


@contextmanager
def _api_calls():
    """Around ``kfp.Client`` calls: a socket timeout, and no warning about the client's version."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(API_TIMEOUT_S)  # urllib3 (under kfp.Client) uses it for every connect and read
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This client only works", category=FutureWarning)
            yield
    finally:
        socket.setdefaulttimeout(previous)


def _reason(err: Exception) -> str:
    """The cause of a failed API call in one line, without urllib3's object reprs."""
    from kfp_server_api.exceptions import ApiException

    if isinstance(err, ApiException) and err.status:
        text = f"HTTP {err.status} {err.reason or ''}".rstrip()
        try:
            message = json.loads(err.body or b"{}").get("message")
        except (ValueError, AttributeError):
            message = None
        text += f" ({message})" if message else ""
    else:
        text = str(err.reason) if isinstance(err, (ApiException, urllib3.exceptions.MaxRetryError)) else str(err)
        # urllib3 starts with its connection object: "<...HTTPConnection object at 0x..>: " or "HTTPConnection(...): ".
        text = re.sub(r"<[^<>]*>: |\b\w*Connection(Pool)?\([^()]*\): ", "", text) or type(err).__name__
    return " ".join(text.split())


def _create_in_experiment(cfg: CtrConfig, pipeline_path: Path, what: str, create) -> tuple[str, Any]:
    """``(experiment id, create(client, experiment id))``: a run or a recurring run (``what``) created in
    ``cluster.experiment`` (created if missing); raises :class:`SubmitError` when the KFP API cannot be reached or
    refuses."""
    cluster = cfg.cluster
    host = cluster.host.rstrip("/")
    stage = "connecting"
    try:
        with _api_calls():
            client = _FailFastClient(host=host, namespace=cluster.namespace)
            stage = f"finding or creating experiment '{cluster.experiment}' in namespace '{cluster.namespace}'"
            experiment = client.create_experiment(name=cluster.experiment, namespace=cluster.namespace)
            stage = f"creating the {what}"
            return experiment.experiment_id, create(client, experiment.experiment_id)
    # Whatever the API answered or failed to, the way out is the same: the compiled pipeline, by hand.
    except Exception as err:
        raise SubmitError(f"submitting to Kubeflow Pipelines at {host} failed while {stage}: {_reason(err)}. "
                          f"The compiled pipeline is {pipeline_path}: upload it in the Kubeflow UI "
                          f"(Pipelines > Upload pipeline) and create the {what} there") from err


def submit(cfg: CtrConfig, pipeline_path: Path) -> SubmittedRun:
    """Create a run of the compiled pipeline in ``cluster.experiment`` (created if missing) with the run
    parameters' defaults; raises :class:`SubmitError` when the KFP API cannot be reached or refuses."""
    cluster = cfg.cluster
    host = cluster.host.rstrip("/")
    parameters = run_parameters(cfg)
    day = f" {cfg.data.day}" if cfg.data.day is not None else ""
    run_name = f"{PIPELINE_NAME}{day} {time.strftime('%Y-%m-%d %H-%M-%S')}"
    submitted_at = dt.datetime.now(dt.timezone.utc).isoformat()

    def create(client: kfp.Client, experiment_id: str):
        return client.run_pipeline(experiment_id=experiment_id, job_name=run_name, params=parameters,
                                   pipeline_package_path=str(pipeline_path),
                                   service_account=cluster.pipeline_service_account)

    experiment_id, created = _create_in_experiment(cfg, pipeline_path, "run", create)
    return SubmittedRun(run_id=created.run_id, url=f"{host}/#/runs/details/{created.run_id}", host=host,
                        namespace=cluster.namespace, experiment=cluster.experiment, experiment_id=experiment_id,
                        run_name=run_name, submitted_at=submitted_at,
                        service_account=cluster.pipeline_service_account, parameters=parameters,
                        pipeline=str(pipeline_path))


def submit_days(cfg: CtrConfig, pipeline_path: Path, run_dir: Path) -> list[SubmittedRun]:
    """``data.days``: one run per day, in order, each submitted once the day before has SUCCEEDED (the days
    continue one checkpoint store, which learns them in order); returns the runs. They are recorded in ``run_dir``
    as they are submitted. A day that does not succeed stops there: :class:`RunError` (:class:`SubmitError` when it
    cannot be submitted), naming the day."""
    days = expand_days(cfg.data.days or [])
    runs: list[SubmittedRun] = []
    for n, day in enumerate(days, 1):
        of = f"day '{day}' ({n} of {len(days)})"
        try:
            submitted = submit(replace(cfg, data=replace(cfg.data, day=day)), pipeline_path)
            runs.append(submitted)
            (run_dir / DAY_RUNS_FILE).write_text(json.dumps([asdict(r) for r in runs], indent=2) + "\n")
            print(f"{of}: Kubeflow run {submitted.run_id} submitted: {submitted.url}", flush=True)
            wait_for_run(cfg, submitted)
        except SubmitError as err:
            left = f"; not submitted: {len(days) - n} more, from day '{days[n]}'" if n < len(days) else ""
            raise type(err)(f"{of}: {err}{left}") from err
    return runs


def create_recurring_run(cfg: CtrConfig, pipeline_path: Path) -> RecurringRun:
    """``cluster.schedule``: a recurring run of the compiled pipeline in ``cluster.experiment``, each of whose runs
    trains the day its scheduled time names (its ``day`` parameter is ""); raises :class:`SubmitError` when the KFP
    API cannot be reached or refuses.

    One run at a time (``max_concurrency=1``): the days continue one store, in order. Missed runs are caught up
    (``no_catchup=False``): a run that a paused schedule, an outage or a day that trained past the next one's time
    left out would run later, in order, with its own scheduled time, hence its own day; without that its day could
    never be trained on that store again (the days after it are, and a store learns its days in order).
    """
    cluster = cfg.cluster
    host = cluster.host.rstrip("/")
    parameters = {**run_parameters(cfg), "day": ""}
    name = f"{PIPELINE_NAME} daily ({cluster.schedule})"
    created_at = dt.datetime.now(dt.timezone.utc).isoformat()

    def create(client: kfp.Client, experiment_id: str):
        return client.create_recurring_run(experiment_id=experiment_id, job_name=name, cron_expression=cluster.schedule,
                                           max_concurrency=1, no_catchup=False, params=parameters,
                                           pipeline_package_path=str(pipeline_path),
                                           service_account=cluster.pipeline_service_account)

    experiment_id, created = _create_in_experiment(cfg, pipeline_path, "recurring run", create)
    run_id = created.recurring_run_id
    return RecurringRun(recurring_run_id=run_id, url=f"{host}/#/recurringrun/details/{run_id}", host=host,
                        namespace=cluster.namespace, experiment=cluster.experiment, experiment_id=experiment_id,
                        name=name, cron=cluster.schedule, created_at=created_at,
                        service_account=cluster.pipeline_service_account, parameters=parameters,
                        pipeline=str(pipeline_path))


def wait_for_run(cfg: CtrConfig, submitted: SubmittedRun) -> None:
    """Poll the run every ``cluster.poll_s`` until it ends, printing each state it enters (one line each).

    Returns when the run SUCCEEDED; raises :class:`RunError` when it ended otherwise, is still going after
    ``cluster.wait_timeout_s`` (it goes on; only the waiting stops) or cannot be polled.
    """
    cluster, name = cfg.cluster, f"Kubeflow run {submitted.run_id}"
    started = time.monotonic()
    client, state, failures = None, None, 0
    while True:
        elapsed = time.monotonic() - started
        try:
            with _api_calls():
                client = client or _FailFastClient(host=submitted.host, namespace=submitted.namespace)
                run = client.get_run(submitted.run_id)
        except Exception as err:  # whatever the cause, a later poll may get through
            failures += 1
            print(f"{name}: poll failed ({failures} in a row): {_reason(err)}", flush=True)
            if failures == POLL_FAILURES_TOLERATED:
                raise RunError(f"{name} could not be polled {failures} times in a row ({_reason(err)}); it may "
                               f"still be running: {submitted.url}") from err
        else:
            failures = 0
            if run.state != state:
                state = run.state
                print(f"{name}: {state} ({elapsed:.0f} s)", flush=True)
            if state == "SUCCEEDED":
                return
            if state in FINAL_STATES:
                error = getattr(run.error, "message", None)
                raise RunError(f"{name} ended {state}{f': {error}' if error else ''} ({submitted.url})")
        if elapsed >= cluster.wait_timeout_s:
            raise RunError(f"{name} is still {state or 'not polled'} after {cluster.wait_timeout_s:g} s "
                           f"(cluster.wait_timeout_s); it goes on without this command: {submitted.url}")
        time.sleep(min(cluster.poll_s, cluster.wait_timeout_s - elapsed))  # the last poll at the deadline


def run_metrics(submitted: SubmittedRun) -> tuple[str, dict]:
    """``(id of the evaluated checkpoint, test metrics)`` that the run's evaluate step left at the root of its
    checkpoint store (``EVALUATION.json``), read with this machine's storage credentials.

    Raises :class:`RunError` when they cannot be read or are not of a checkpoint the run made (a checkpoint
    id made before the submission: what an earlier run at the same ``checkpoint_uri`` left).
    """
    from components.checkpoint.evaluation import EVALUATION_FILE, read_evaluation
    from components.checkpoint.format import CheckpointError
    from components.checkpoint.store import id_time

    name = f"Kubeflow run {submitted.run_id}"
    uri = submitted.parameters["checkpoint_uri"]
    where = f"{uri.rstrip('/')}/{EVALUATION_FILE}"
    try:
        evaluation = read_evaluation(uri)
    except CheckpointError as err:
        raise RunError(f"{name} succeeded, but its metrics could not be read with this machine's storage "
                       f"credentials: {err}") from err
    if evaluation is None:
        raise RunError(f"{name} succeeded, but there is no {where}: the run's evaluate step writes it "
                       f"({submitted.url})")
    checkpoint = evaluation.get("checkpoint")
    try:
        made = id_time(checkpoint)
    except ValueError as err:
        raise RunError(f"{where} does not name the checkpoint it evaluates: {err}") from err
    if made <= dt.datetime.fromisoformat(submitted.submitted_at):
        raise RunError(f"{where} is stale: it evaluates checkpoint {checkpoint}, made before {name} was "
                       f"submitted ({submitted.submitted_at}), so the run evaluated no checkpoint of its own "
                       f"({submitted.url})")
    return checkpoint, evaluation["metrics"]


def _print_rows(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    print("\n".join(["", title, *(f"  {name:<{width}}  {value}" for name, value in rows), ""]), flush=True)


def check_days_submission(cfg: CtrConfig) -> None:
    """A recurring run names its runs' days from their scheduled times: no day list or day of the command line's."""
    if cfg.cluster.schedule is None:
        return
    for key, value in (("data.days", cfg.data.days), ("data.day", cfg.data.day)):
        if value is not None:
            raise ConfigError(key, list(value) if key == "data.days" else value, "null with cluster.schedule",
                              "each run of the recurring run trains the day its scheduled time names: train the days "
                              "before it with data.days=[...] first, then create the recurring run without them")


def run_kubeflow(cfg: CtrConfig) -> RunResult:
    """Compile into ``run_dir`` and, with ``cluster.submit``, start a run on Kubeflow Pipelines: with day partitions,
    the run of ``data.day``, the runs of ``data.days`` one after the other, or the recurring run of
    ``cluster.schedule``.

    With ``cluster.wait``, wait for the run (the last day's), write its test metrics into ``run_dir`` and return them
    with the checkpoint it evaluated; otherwise nothing was measured here.
    """
    check_days_submission(cfg)
    run_dir = Path(cfg.run_dir)
    unmeasured = RunResult(metrics={}, run_dir=run_dir)
    pipeline_path = write_run_files(cfg, run_dir)
    files = [("pipeline", str(pipeline_path)), ("config", str(run_dir / CONFIG_FILE)),
             ("rbac", f"{run_dir / RBAC_FILE} (kubectl apply -f it once per namespace)"),
             ("ps job", f"{run_dir / PS_JOB_FILE} (what the train step creates, to review: "
                        "kubectl apply --dry-run=server -f)")]
    if cfg.cluster.image_signing_key:
        files.append(("image policy", f"{run_dir / IMAGE_POLICY_FILE} (kubectl apply -f it once; sigstore "
                                      "policy-controller)"))
    if not cfg.cluster.submit:
        _print_rows("== Kubeflow pipeline compiled (cluster.submit=false: not submitted)", [
            *files, ("upload", "Kubeflow UI > Pipelines > Upload pipeline, then Create run"),
            ("parameters", ", ".join(RUN_PARAMETERS))])
        return unmeasured
    if cfg.cluster.schedule is not None:
        recurring = create_recurring_run(cfg, pipeline_path)
        (run_dir / RECURRING_RUN_FILE).write_text(json.dumps(asdict(recurring), indent=2) + "\n")
        _print_rows("== Kubeflow recurring run created", [
            ("recurring run id", recurring.recurring_run_id), ("recurring run", recurring.url),
            ("schedule", f"{recurring.cron} (cron, seconds first; one run at a time, missed runs caught up)"),
            ("experiment", f"{recurring.experiment} ({recurring.namespace})"), *files,
            ("record", str(run_dir / RECURRING_RUN_FILE))])
        return unmeasured
    if is_daily(cfg.data.uri) and cfg.data.day is None:
        runs = submit_days(cfg, pipeline_path, run_dir)
        submitted = runs[-1]
        _print_rows(f"== Kubeflow runs of data.days succeeded: {len(runs)} days", [
            ("last day", f"{submitted.parameters['day']}: {submitted.url}"),
            ("experiment", f"{submitted.experiment} ({submitted.namespace})"), *files,
            ("record", str(run_dir / DAY_RUNS_FILE))])
        if not cfg.cluster.wait:
            return unmeasured
    else:
        submitted = submit(cfg, pipeline_path)
        (run_dir / RUN_FILE).write_text(json.dumps(asdict(submitted), indent=2) + "\n")
        _print_rows("== Kubeflow run submitted", [
            ("run id", submitted.run_id), ("run", submitted.url),
            ("experiment", f"{submitted.experiment} ({submitted.namespace})"), *files,
            ("record", str(run_dir / RUN_FILE))])
        if not cfg.cluster.wait:
            return unmeasured
        wait_for_run(cfg, submitted)
    from components.checkpoint.format import write_json_atomic

    checkpoint, metrics = run_metrics(submitted)
    write_json_atomic(run_dir / METRICS_FILE, metrics)
    objective = float(metrics[cfg.objective])
    _print_rows("== Kubeflow run succeeded", [
        ("run", submitted.url), ("checkpoint", f"{submitted.parameters['checkpoint_uri'].rstrip('/')}/{checkpoint}"),
        (f"test {cfg.objective}", f"{objective:.4f}"), ("metrics", str(run_dir / METRICS_FILE))])
    return RunResult(metrics=metrics, run_dir=run_dir, checkpoint=checkpoint)
