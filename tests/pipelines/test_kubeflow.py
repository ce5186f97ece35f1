"""Kubeflow: the compiled pipeline (golden), submission and waiting against a fake KFP API on loopback (runs'
results in a loopback S3 endpoint), the CLI, sweeps.

The golden files ``tests/pipelines/golden/kubeflow_pipeline.yaml`` (the compiled pipeline of a fixed prod config,
normalised for what changes with the kfp SDK release), ``kubeflow_ps_job.yaml`` (the PS job objects written for
review beside it, ``k8s/ps-job.yaml``) and ``kubeflow_inference_service.yaml`` (the online server's, written beside
them, ``k8s/inference-service.yaml``) pin what a run would be given. After an intended change to the pipeline, its
components, the manifests or the config schema, regenerate them and review the diff::

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/pipelines/test_kubeflow.py -k golden
"""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from google.protobuf import json_format
from kfp.kubernetes import kubernetes_executor_config_pb2
from kfp.pipeline_spec import pipeline_spec_pb2

from components.checkpoint.store import make_id
from components.config import from_dict
from components.checkpoint.evaluation import read_evaluation, record_evaluation
from components.export.signing import SECRET_MOUNT
from components.resolve.step import RUN_PARAMETERS, config_struct, run_parameters
import pipelines.kubeflow
from pipelines.ctr import run
from pipelines.errors import ExitStatus
from pipelines.kubeflow import RunError, SubmitError
from pipelines.local import local_config
from components.train.backends import manifests
from pipelines.pipeline import (BASELINE_TASK, EXIT_HANDLER, EXIT_HANDLER_NAME, EXIT_TASK, KUBEFLOW_DEPENDENCIES,
                                LAUNCHER_POD_FIELDS, LAUNCHER_TASKS, RETRIED_TASKS, TASKS, compile_pipeline,
                                compiled_config, display_names)
from tests.conftest import FAKE_KEY_ID, FAKE_SECRET, compose_config, needs_schemas
from tests.pipelines.spec import pipeline_tasks
from tests.train.backends.kube_controllers import training_runtime_errors, trainjob_jobset

GOLDEN = Path(__file__).parent / "golden" / "kubeflow_pipeline.yaml"
GOLDEN_PS_JOB = Path(__file__).parent / "golden" / "kubeflow_ps_job.yaml"
GOLDEN_INFERENCE_SERVICE = Path(__file__).parent / "golden" / "kubeflow_inference_service.yaml"
DIGEST = "sha256:" + "ab" * 32
PROD = ("+cluster=prod", "checkpoint.uri=s3://ctr-bucket/golden/checkpoints")
GOLDEN_OVERRIDES = (*PROD, "cluster.submit=false", f"cluster.pipeline_image.digest={DIGEST}",
                    "cluster.pipeline_root=s3://ctr-bucket/kfp", "ps.epochs=2", "cluster.backend=trainjob",
                    "cluster.image_pull_secrets=[regcred]", "eval.min_auc=0.7")


def _normalised(documents: list) -> str:
    """The compiled documents without what changes with the kfp SDK release: its version and kfp pins."""
    documents[0]["sdkVersion"] = "kfp-<version>"
    unpinned = re.sub(r"kfp==[0-9][^\s\"'\\]*", "kfp==<version>", json.dumps(documents))
    return yaml.safe_dump_all(json.loads(unpinned), sort_keys=True)


@pytest.fixture
def fake_credentials(monkeypatch):
    """Credentials in this process's environment, which must not leak into anything compiled or sent."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)


def test_compiled_prod_pipeline_matches_golden(tmp_path, fake_credentials):
    run_dir = tmp_path / "hydra-run-dir"
    cfg = from_dict(compose_config(run_dir, *GOLDEN_OVERRIDES))
    pipelines.kubeflow.write_run_files(cfg, tmp_path / "compiled")
    text = (tmp_path / "compiled" / "pipeline.yaml").read_text()
    ps_job_text = (tmp_path / "compiled" / "k8s" / "ps-job.yaml").read_text()
    service_text = (tmp_path / "compiled" / "k8s" / "inference-service.yaml").read_text()
    for leak in ("${", "hydra", str(run_dir), FAKE_SECRET, FAKE_KEY_ID):
        assert leak not in text and leak not in ps_job_text and leak not in service_text, leak
    documents = list(yaml.safe_load_all(text))
    assert len(documents) == 2  # the pipeline spec, then the Kubernetes platform spec

    spec = json_format.ParseDict(documents[0], pipeline_spec_pb2.PipelineSpec())
    parameters = spec.root.input_definitions.parameters
    assert set(parameters) == set(RUN_PARAMETERS)
    assert {name: json_format.MessageToDict(p.default_value) for name, p in parameters.items()} == \
        run_parameters(cfg) == {"data_uri": "", "epochs": 2, "learning_rate": 0.001, "table_learning_rate": 0.05,
                                "batch_size": 256, "checkpoint_uri": "s3://ctr-bucket/golden/checkpoints",
                                "resume": "none", "day": ""}
    tasks = pipeline_tasks(spec)
    constant = tasks["resolve-config"][0].inputs.parameters["config"].runtime_value.constant
    assert json_format.MessageToDict(constant) == config_struct(compiled_config(cfg))
    # Every step inside the exit handler; its exit task runs once they all ended, however they ended.
    assert set(spec.root.dag.tasks) == {EXIT_HANDLER, EXIT_TASK}
    assert set(tasks) == {*TASKS, EXIT_TASK} and tasks["resolve-config"][1].task_info.name == EXIT_HANDLER_NAME
    exit_task = spec.root.dag.tasks[EXIT_TASK]
    assert list(exit_task.dependent_tasks) == [EXIT_HANDLER]
    assert exit_task.trigger_policy.strategy == exit_task.trigger_policy.TriggerStrategy.ALL_UPSTREAM_TASKS_COMPLETED
    assert not exit_task.caching_options.enable_cache  # a cached clean-up would delete nothing
    # fit-baseline runs beside the train step, which the model that blends it in waits for at its first checkpoint:
    # the fit is handed over through the run's checkpoint store (components.networks.baseline_handoff).
    handler = spec.components[spec.root.dag.tasks[EXIT_HANDLER].component_ref.name].dag.tasks
    for name in (BASELINE_TASK, "train", "evaluate-model"):
        assert set(handler[name].dependent_tasks) == set(KUBEFLOW_DEPENDENCIES[name]), name
    train_inputs, fit_inputs = handler["train"].inputs, handler[BASELINE_TASK].inputs
    assert "baseline" not in train_inputs.artifacts and "fits_baseline" not in train_inputs.parameters
    for inputs in (train_inputs, fit_inputs):
        store = inputs.parameters["baseline_root" if inputs is train_inputs else "handoff_root"].task_output_parameter
        assert (store.producer_task, store.output_parameter_key) == ("resolve-config", "checkpoint_uri")
    cluster = exit_task.inputs.parameters["cluster"].runtime_value.constant
    assert json_format.MessageToDict(cluster) == config_struct(compiled_config(cfg))["cluster"]
    # KFP allows no pipeline outputs from inside an exit handler: the driver reads the run's metrics from the store.
    assert not spec.root.output_definitions.artifacts
    assert spec.default_pipeline_root == "s3://ctr-bucket/kfp"
    executors = documents[0]["deploymentSpec"]["executors"]
    images = {executor["container"]["image"] for executor in executors.values()}
    assert images == {f"registry.example.com/paddle-ps-pipelines:0.1.0@{DIGEST}"}
    # Quota-enforced namespaces: every task requests and is limited in CPU and memory (cluster.steps).
    for name in (*TASKS, EXIT_TASK):
        resources = executors[f"exec-{name}"]["container"]["resources"]
        assert {"resourceCpuRequest", "resourceCpuLimit", "resourceMemoryRequest", "resourceMemoryLimit"} <= \
            set(resources), name
    assert executors["exec-convert-data"]["container"]["resources"]["resourceMemoryLimit"] == \
        cfg.cluster.steps.prepare.memory
    names = display_names(cfg)
    for name, (task, group) in tasks.items():
        assert task.task_info.name == names[name]
        retry = task.retry_policy
        assert (retry.max_retry_count, retry.backoff_duration.seconds) == \
            ((2, 60) if name in RETRIED_TASKS else (0, 0)), name
    _, gate = tasks["export-model"]
    assert gate.trigger_policy.condition == "inputs.parameter_values['pipelinechannel--evaluate-model-Output'] >= 0.7"

    platform = json_format.ParseDict(documents[1], pipeline_spec_pb2.PlatformSpec())
    platform_executors = json_format.MessageToDict(platform.platforms["kubernetes"].deployment_spec)["executors"]
    assert set(platform_executors) == {f"exec-{task}" for task in (*TASKS, EXIT_TASK)}
    launchers = {f"exec-{task}" for task in LAUNCHER_TASKS}
    for name, raw in platform_executors.items():
        k8s = json_format.ParseDict(raw, kubernetes_executor_config_pb2.KubernetesExecutorConfig())
        assert [(s.secret_name, {m.env_var: m.secret_key for m in s.key_to_env}) for s in k8s.secret_as_env] == ([
            ("ctr-storage", {"AWS_ACCESS_KEY_ID": "access_key_id", "AWS_SECRET_ACCESS_KEY": "secret_access_key"})]
            if name != f"exec-{EXIT_TASK}" else []), name  # the clean-up reads no storage
        assert k8s.security_context.run_as_non_root and k8s.security_context.run_as_user == 1000
        assert [secret.secret_name for secret in k8s.image_pull_secret] == ["regcred"]
        pod_fields = {f.name: f.field_path for f in k8s.field_path_as_env}
        assert pod_fields == (LAUNCHER_POD_FIELDS if name in launchers else {}), name
        # Only the train step and the clean-up request tokens of the account that may create and delete PS jobs (no
        # token Secret is mounted anywhere); the export step alone carries the key that signs serving.json
        # (export.signing_key=auto on Kubeflow).
        volumes = [(v.secret_name, v.mount_path) for v in k8s.secret_as_volume]
        assert volumes == ([("ctr-export-signing", SECRET_MOUNT)] if name == "exec-export-model" else []), name
        env = {e["name"]: e["value"] for e in documents[0]["deploymentSpec"]["executors"][name]["container"].get(
            "env", [])}
        assert env.get(manifests.LAUNCHER_ACCOUNT_ENV) == ("ctr-ps-launcher" if name in launchers else None), name

    # The PS job objects written for review: its pods opt out of sidecars and pull with the secrets.
    runtime, trainjob = [obj for obj in yaml.safe_load_all(ps_job_text) if obj["kind"] != "NetworkPolicy"]
    for rjob in trainjob_jobset(runtime, trainjob)["spec"]["replicatedJobs"]:
        pod = rjob["template"]["spec"]["template"]
        assert pod["metadata"]["labels"][manifests.SIDECAR_INJECT_LABEL] == "false"
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]

    normalised = _normalised(documents)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(normalised)
        GOLDEN_PS_JOB.write_text(ps_job_text)
        GOLDEN_INFERENCE_SERVICE.write_text(service_text)
    assert normalised == GOLDEN.read_text(), "the compiled pipeline changed: see the module docstring"
    assert ps_job_text == GOLDEN_PS_JOB.read_text(), "the PS job objects changed: see the module docstring"
    assert service_text == GOLDEN_INFERENCE_SERVICE.read_text(), "the InferenceService changed: see the module docstring"


def test_a_step_given_gpus_gets_an_accelerator_and_retries_can_be_turned_off(tmp_path):
    cfg = from_dict(compose_config(tmp_path, *PROD, "cluster.submit=false", "cluster.steps.evaluate.gpus=1",
                                   "cluster.steps.train.cpu_limit=2", "cluster.step_retries=0"))
    spec = next(yaml.safe_load_all(Path(compile_pipeline(cfg, tmp_path / "pipeline.yaml")).read_text()))
    executors = spec["deploymentSpec"]["executors"]
    accelerators = {name: executor["container"]["resources"].get("accelerator") for name, executor in executors.items()}
    assert accelerators.pop("exec-evaluate-model") == {"resourceType": "nvidia.com/gpu", "resourceCount": "1",
                                                       "count": "1", "type": "nvidia.com/gpu"}
    assert set(accelerators.values()) == {None}
    train = executors["exec-train"]["container"]["resources"]
    assert (train["resourceCpuRequest"], train["resourceCpuLimit"]) == ("1", "2")
    parsed = json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
    assert all(not task.HasField("retry_policy") for task, _ in pipeline_tasks(parsed).values())


def test_local_runner_compiles_without_kubernetes_settings(tmp_path):
    cfg = local_config(from_dict(compose_config(tmp_path)))  # as a local run makes it: its step cache named
    text = Path(compile_pipeline(cfg, tmp_path / "pipeline.yaml")).read_text()
    assert len(list(yaml.safe_load_all(text))) == 1
    assert "pipelineConfig" not in text


def test_a_kubeflow_run_is_cleaned_up_after_its_ttl_and_stopped_at_its_deadline(tmp_path):
    cfg = from_dict(compose_config(tmp_path, *PROD, "cluster.submit=false", "cluster.run_ttl_s=3600",
                                   "cluster.run_deadline_s=7200"))
    platform = list(yaml.safe_load_all(Path(compile_pipeline(cfg, tmp_path / "pipeline.yaml")).read_text()))[1]
    assert platform["platforms"]["kubernetes"]["pipelineConfig"] == {"resourceTtlOnCompletion": 3600,
                                                                     "activeDeadlineSeconds": 7200}
    never = from_dict(compose_config(tmp_path, *PROD, "cluster.submit=false", "cluster.run_deadline_s=null"))
    platform = list(yaml.safe_load_all(Path(compile_pipeline(never, tmp_path / "never.yaml")).read_text()))[1]
    assert "activeDeadlineSeconds" not in platform["platforms"]["kubernetes"]["pipelineConfig"]


class FakeKfpApi:
    """The KFP v2beta1 REST endpoints ``kfp.Client`` calls to submit and poll a run and to create a recurring run,
    on 127.0.0.1, recording requests.

    ``fail`` maps ``"POST /apis/v2beta1/runs"``-style keys (``"GET /apis/v2beta1/runs/{run_id}"`` for any run)
    to the HTTP status the endpoint answers with, or to a list of statuses answered in turn before it works.
    A created run is PENDING for ``polls_per_state`` polls, then RUNNING as long, then ends in ``outcome``
    (None: runs forever; a list: the n-th run created ends in its n-th item); when it succeeds, ``execute(run)``
    stands for what its steps wrote.
    """

    def __init__(self, experiments=(), fail=None, outcome="SUCCEEDED", polls_per_state=2, execute=None):
        self.requests: list[dict] = []
        self.experiments = {e["experiment_id"]: e for e in experiments}
        self.runs: dict[str, dict] = {}
        self.recurring_runs: dict[str, dict] = {}
        self.fail = dict(fail or {})
        self.outcomes = list(outcome) if isinstance(outcome, list) else None
        self.outcome = outcome
        self.polls_per_state = polls_per_state
        self.execute = execute
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                api._handle(self, "GET")

            def do_POST(self):
                api._handle(self, "POST")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, handler, method):
        url = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length)) if length else None
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.requests.append({"method": method, "path": url.path, "query": query, "body": body})
        status, answer = self._answer(f"{method} {url.path}", query, body)
        data = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _answer(self, key, query, body):
        run_id = None
        if key.startswith("GET /apis/v2beta1/runs/"):
            key, run_id = key.rsplit("/", 1)[0] + "/{run_id}", key.rsplit("/", 1)[1]
        statuses = self.fail.get(key)
        if isinstance(statuses, list) and statuses:
            return statuses.pop(0), {"code": 14, "message": "unavailable"}
        if isinstance(statuses, int):
            return statuses, {"code": 7, "message": "user is not authorized"}
        if key == "GET /apis/v2beta1/healthz":
            return 200, {"multi_user": False}
        if key == "GET /apis/v2beta1/experiments":
            name = json.loads(query["filter"])["predicates"][0]["stringValue"]
            found = [e for e in self.experiments.values()
                     if e["display_name"] == name and e["namespace"] == query.get("namespace")]
            return 200, ({"experiments": found, "total_size": len(found)} if found else {})
        if key == "POST /apis/v2beta1/experiments":
            experiment = {**body, "experiment_id": str(uuid.uuid4())}
            self.experiments[experiment["experiment_id"]] = experiment
            return 200, experiment
        if key == "POST /apis/v2beta1/runs":
            created = {**body, "run_id": str(uuid.uuid4()), "state": "PENDING"}
            outcome = self.outcomes.pop(0) if self.outcomes is not None else self.outcome
            self.runs[created["run_id"]] = {**created, "polls": 0,
                                            "states": ["PENDING", "RUNNING", *([outcome] if outcome else [])]}
            return 200, created
        if key == "POST /apis/v2beta1/recurringruns":
            created = {**body, "recurring_run_id": str(uuid.uuid4()), "status": "ENABLED"}
            self.recurring_runs[created["recurring_run_id"]] = created
            return 200, created
        if key == "GET /apis/v2beta1/runs/{run_id}" and run_id in self.runs:
            return 200, self._poll(self.runs[run_id])
        return 404, {"code": 5, "message": f"no route {key}"}

    def _poll(self, run):
        run["polls"] += 1
        states = run["states"]
        state = states[min(run["polls"] // self.polls_per_state, len(states) - 1)]
        if state != run["state"]:
            run["state"] = state
            if state == "SUCCEEDED" and self.execute:
                self.execute(run)
            if state == "FAILED":
                run["error"] = {"code": 2, "message": "task 'train' failed: worker 0 exited with 1"}
        return {k: v for k, v in run.items() if k not in ("polls", "states")}

    def posts(self, path):
        return [r["body"] for r in self.requests if r["method"] == "POST" and r["path"] == path]


@pytest.mark.parametrize("existing", [False, True], ids=["experiment-created", "experiment-reused"])
def test_submit_creates_one_run_in_the_experiment(tmp_path, capsys, fake_credentials, existing):
    known = [{"experiment_id": "exp-1", "display_name": "ctr-ps", "namespace": "kubeflow"}] if existing else []
    run_dir = tmp_path / "run"
    with FakeKfpApi(experiments=known) as api:
        cfg = compose_config(run_dir, *PROD, f"cluster.host={api.url}", "ps.epochs=3")
        result = run(cfg)
    assert result.metrics == {} and result.checkpoint is None  # submitted, not waited for: nothing measured

    created = api.posts("/apis/v2beta1/experiments")
    assert created == ([] if existing else [{"display_name": "ctr-ps", "namespace": "kubeflow"}])
    [experiment_id] = api.experiments
    [submitted] = api.posts("/apis/v2beta1/runs")
    typed = from_dict(cfg)
    assert submitted["experiment_id"] == experiment_id
    assert submitted["service_account"] == "default-editor"  # the steps' plain account; train acts as the launcher
    assert submitted["runtime_config"]["parameters"] == run_parameters(typed)
    assert submitted["runtime_config"]["parameters"]["epochs"] == 3
    # The run carries the compiled pipeline of the run directory, platform spec (secret references) included.
    compiled = list(yaml.safe_load_all((run_dir / "pipeline.yaml").read_text()))
    assert submitted["pipeline_spec"] == {"pipeline_spec": compiled[0], "platform_spec": compiled[1]}
    sent = json.dumps(api.requests)
    assert FAKE_SECRET not in sent and FAKE_KEY_ID not in sent

    [run_id] = api.runs
    record = json.loads((run_dir / "kubeflow_run.json").read_text())
    assert record["run_id"] == run_id and record["experiment_id"] == experiment_id
    assert record["url"] == f"{api.url}/#/runs/details/{run_id}"
    assert record["parameters"] == run_parameters(typed)
    out = capsys.readouterr().out
    assert run_id in out and record["url"] in out


def test_an_http_error_names_the_stage_and_the_compiled_pipeline(tmp_path, fake_credentials):
    run_dir = tmp_path / "run"
    with FakeKfpApi(fail={"POST /apis/v2beta1/runs": 403}) as api:
        with pytest.raises(SubmitError) as err:
            run(compose_config(run_dir, *PROD, f"cluster.host={api.url}"))
    message = str(err.value)
    assert "\n" not in message
    assert f"at {api.url} failed while creating the run: HTTP 403 Forbidden (user is not authorized)" in message
    assert str(run_dir / "pipeline.yaml") in message and (run_dir / "pipeline.yaml").is_file()
    assert len(api.posts("/apis/v2beta1/runs")) == 1  # refused once, never resent
    assert not (run_dir / "kubeflow_run.json").exists()


def _cli(tmp_path, *overrides):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pipelines.ctr", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET})
    return proc, time.monotonic() - started


def test_cli_compiles_without_submitting(tmp_path):
    proc, _ = _cli(tmp_path, "+cluster=prod", "cluster.submit=false", "checkpoint.uri=s3://bucket/x")
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "run"
    for name in ("pipeline.yaml", "config.yaml", "k8s/rbac.yaml"):
        assert (run_dir / name).is_file(), name
        assert FAKE_SECRET not in (run_dir / name).read_text()
    assert str(run_dir / "pipeline.yaml") in proc.stdout and "Upload pipeline" in proc.stdout
    assert str(run_dir / "k8s" / "ps-job.yaml") in proc.stdout
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["cluster"]["runner"] == "kubeflow" and config["checkpoint"]["uri"] == "s3://bucket/x"
    kinds = {doc["kind"] for doc in yaml.safe_load_all((run_dir / "k8s/rbac.yaml").read_text())}
    assert {"ServiceAccount", "Role", "RoleBinding", "ValidatingAdmissionPolicy"} <= kinds and "Secret" not in kinds
    assert [doc["kind"] for doc in yaml.safe_load_all((run_dir / "k8s/ps-job.yaml").read_text())] == \
        ["NetworkPolicy", "JobSet"]
    # Nothing ran here: no PS process, no kfp.local artifacts, no submission record.
    assert not any((run_dir / name).exists() for name in ("logs", "kfp", "checkpoint", "kubeflow_run.json"))
    assert "PS job" not in proc.stdout


@needs_schemas
def test_cli_writes_a_trainjob_to_review_that_trainer_would_accept(tmp_path):
    """The review command for the Trainer backend: pipeline.yaml, and a TrainingRuntime + TrainJob that fit the
    Trainer CRDs, pass its webhook's rules and make a JobSet that fits the JobSet CRD."""
    import jsonschema

    from tests.conftest import SCHEMAS

    proc, _ = _cli(tmp_path, "+cluster=prod", "cluster.backend=trainjob", "cluster.submit=false",
                   "checkpoint.uri=s3://bucket/x")
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "run"
    assert (run_dir / "pipeline.yaml").is_file()
    objects = {doc["kind"]: doc for doc in yaml.safe_load_all((run_dir / "k8s/ps-job.yaml").read_text())}
    assert list(objects) == ["NetworkPolicy", "TrainingRuntime", "TrainJob"]

    def schema(name):
        return yaml.safe_load((SCHEMAS / name).read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    jsonschema.validate(objects["TrainingRuntime"], schema("trainer.kubeflow.org_trainingruntimes.yaml"))
    jsonschema.validate(objects["TrainJob"], schema("trainer.kubeflow.org_trainjobs.yaml"))
    assert training_runtime_errors(objects["TrainingRuntime"]) == []
    jobset = trainjob_jobset(objects["TrainingRuntime"], objects["TrainJob"])
    jsonschema.validate(jobset, schema("jobset.x-k8s.io_jobsets.yaml"))
    assert objects["TrainJob"]["spec"]["trainer"]["numNodes"] == 2
    rbac = {(doc["kind"], doc["metadata"]["name"]): doc
            for doc in yaml.safe_load_all((run_dir / "k8s/rbac.yaml").read_text())}
    assert {"trainjobs", "trainingruntimes"} <= set(rbac["Role", "ctr-ps-launcher"]["rules"][0]["resources"])


def test_cli_reports_an_unreachable_host_in_one_line(tmp_path):
    with socket.socket() as probe:  # a loopback port that nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        host = f"http://127.0.0.1:{probe.getsockname()[1]}"
    proc, seconds = _cli(tmp_path, *PROD, f"cluster.host={host}")
    assert proc.returncode == ExitStatus.SUBMIT_ERROR, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: submitting to Kubeflow Pipelines at {host} failed while connecting: ")
    assert proc.stdout.strip() == ""  # no retry warnings either
    assert "failed while connecting: Failed to establish a new connection: [Errno 111] Connection refused." in line
    assert f"The compiled pipeline is {tmp_path / 'run' / 'pipeline.yaml'}" in line
    assert (tmp_path / "run" / "pipeline.yaml").is_file()
    assert seconds < 30  # no retry loop (the stock client alone would wait 5 x 5 s for its health check)


# -- cluster.wait and sweeps: runs polled to their end, their objective read from the checkpoint store -------

WAIT = ("+cluster=prod", "cluster.wait=true", "cluster.poll_s=0.05")


def _auc(epochs: int) -> float:
    return 0.7 + 0.01 * epochs


def _evaluate(run):
    """What a run's evaluate step leaves at the root of its checkpoint store: the metrics of a new checkpoint."""
    parameters = run["runtime_config"]["parameters"]
    epochs = parameters["epochs"]
    record_evaluation(parameters["checkpoint_uri"], make_id(epochs, 100 * epochs),
                      {"auc": _auc(epochs), "logloss": 0.45})


def _polls(api, run_id):
    return [r for r in api.requests if r["method"] == "GET" and r["path"] == f"/apis/v2beta1/runs/{run_id}"]


def _state_lines(out: str, run_id: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(f"Kubeflow run {run_id}: ")]


def test_waiting_returns_the_metrics_of_the_run(tmp_path, capsys, s3_endpoint):
    run_dir = tmp_path / "run"
    with FakeKfpApi(execute=_evaluate) as api:
        result = run(compose_config(run_dir, *WAIT, f"cluster.host={api.url}", f"checkpoint.uri={s3_endpoint}",
                                    "ps.epochs=3"))
    metrics = result.metrics
    assert metrics == {"auc": pytest.approx(_auc(3)), "logloss": 0.45} and result.test_auc == metrics["auc"]
    assert result.checkpoint == read_evaluation(s3_endpoint)["checkpoint"]  # what its evaluate step recorded
    assert result.checkpoint.endswith("-e0003-s0000000300") and result.report is None
    assert json.loads((run_dir / "metrics.json").read_text()) == metrics
    [run_id] = api.runs
    assert json.loads((run_dir / "kubeflow_run.json").read_text())["run_id"] == run_id
    # Each state held for 2 polls, and is printed once.
    assert len(_polls(api, run_id)) == 4
    lines = _state_lines(capsys.readouterr().out, run_id)
    assert [line.split(": ")[1].split(" (")[0] for line in lines] == ["PENDING", "RUNNING", "SUCCEEDED"]


@pytest.mark.parametrize("outcome", ["FAILED", "CANCELED"])
def test_a_run_that_does_not_succeed_raises_naming_it(tmp_path, s3_endpoint, outcome):
    run_dir = tmp_path / "run"
    with FakeKfpApi(outcome=outcome, execute=_evaluate) as api:
        with pytest.raises(RunError) as err:
            run(compose_config(run_dir, *WAIT, f"cluster.host={api.url}", f"checkpoint.uri={s3_endpoint}"))
    [run_id] = api.runs
    reason = ": task 'train' failed: worker 0 exited with 1" if outcome == "FAILED" else ""
    assert str(err.value) == f"Kubeflow run {run_id} ended {outcome}{reason} ({api.url}/#/runs/details/{run_id})"
    assert isinstance(err.value, SubmitError)  # the CLI's one-line error, exit status 3
    assert not (run_dir / "metrics.json").exists()


def test_waiting_stops_at_the_timeout(tmp_path, s3_endpoint, monkeypatch):
    waited = []
    wait_for_run = pipelines.kubeflow.wait_for_run

    def timed(cfg, submitted):  # the waiting alone: compiling and submitting take what a busy machine gives them
        started = time.monotonic()
        try:
            return wait_for_run(cfg, submitted)
        finally:
            waited.append(time.monotonic() - started)

    monkeypatch.setattr(pipelines.kubeflow, "wait_for_run", timed)
    with FakeKfpApi(outcome=None) as api:
        with pytest.raises(RunError, match=r"is still RUNNING after 0\.3 s \(cluster\.wait_timeout_s\)"):
            run(compose_config(tmp_path / "run", *WAIT, "cluster.wait_timeout_s=0.3", f"cluster.host={api.url}",
                         f"checkpoint.uri={s3_endpoint}"))
    assert waited[0] < 10  # the 0.3 s timeout, give or take the last poll, not the run's 48 h default


def test_failed_polls_are_retried_then_given_up(tmp_path, capsys, monkeypatch, s3_endpoint):
    monkeypatch.setattr(pipelines.kubeflow, "POLL_FAILURES_TOLERATED", 3)
    overrides = (*WAIT, f"checkpoint.uri={s3_endpoint}")
    with FakeKfpApi(fail={"GET /apis/v2beta1/runs/{run_id}": [503, 503]}, execute=_evaluate) as api:
        waited = run(compose_config(tmp_path / "flaky", *overrides, f"cluster.host={api.url}"))
    assert waited.test_auc == pytest.approx(_auc(1))
    [run_id] = api.runs
    assert f"Kubeflow run {run_id}: poll failed (2 in a row): HTTP 503" in capsys.readouterr().out

    with FakeKfpApi(fail={"GET /apis/v2beta1/runs/{run_id}": [503] * 3}, execute=_evaluate) as api:
        with pytest.raises(RunError, match=r"could not be polled 3 times in a row \(HTTP 503 Service Unavailable"):
            run(compose_config(tmp_path / "down", *overrides, f"cluster.host={api.url}"))


@pytest.mark.parametrize("left_before", [True, False], ids=["stale", "missing"])
def test_a_run_without_an_evaluation_of_its_own_is_refused(tmp_path, s3_endpoint, left_before):
    earlier = "20200101T000000000000Z-e0002-s0000000200"  # what an earlier run at the same URI evaluated
    if left_before:
        record_evaluation(s3_endpoint, earlier, {"auc": 0.99})
    with FakeKfpApi(execute=None) as api:  # succeeds without evaluating anything
        with pytest.raises(RunError) as err:
            run(compose_config(tmp_path / "run", *WAIT, f"cluster.host={api.url}", f"checkpoint.uri={s3_endpoint}"))
    [run_id] = api.runs
    message = str(err.value)
    where = f"{s3_endpoint}/EVALUATION.json"
    if left_before:
        assert message.startswith(f"{where} is stale: it evaluates checkpoint {earlier}, made before Kubeflow "
                                  f"run {run_id} was submitted")
    else:
        assert message.startswith(f"Kubeflow run {run_id} succeeded, but there is no {where}")
    assert f"{api.url}/#/runs/details/{run_id}" in message
    assert not (tmp_path / "run" / "metrics.json").exists()


def _sweep(tmp_path, *overrides):
    """``python -m pipelines.ctr -m +cluster=prod ...`` with this process's environment (the S3 endpoint's)."""
    return subprocess.run([sys.executable, "-m", "pipelines.ctr", "-m", "+cluster=prod", *overrides,
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=dict(os.environ))


def test_a_sweep_waits_for_each_run_and_records_its_objective(tmp_path, s3_endpoint):
    with FakeKfpApi(execute=_evaluate) as api:
        proc = _sweep(tmp_path, f"cluster.host={api.url}", "cluster.wait=true", "cluster.poll_s=0.05",
                      "ps.epochs=1,2", f"checkpoint.uri={s3_endpoint}")
    assert proc.returncode == 0, proc.stderr
    [experiment_id] = api.experiments
    submitted = api.posts("/apis/v2beta1/runs")
    assert [body["runtime_config"]["parameters"]["epochs"] for body in submitted] == [1, 2]
    assert {body["experiment_id"] for body in submitted} == {experiment_id}
    # Each job's run has a store of its own under checkpoint.uri, so no job reads another's evaluation.
    stores = [body["runtime_config"]["parameters"]["checkpoint_uri"] for body in submitted]
    assert len(set(stores)) == 2 and all(uri.startswith(f"{s3_endpoint}/") for uri in stores)
    for job, epochs in enumerate((1, 2)):
        job_dir = tmp_path / "sweep" / str(job)
        record = json.loads((job_dir / "kubeflow_run.json").read_text())
        assert record["run_id"] in api.runs and record["parameters"]["epochs"] == epochs
        assert json.loads((job_dir / "metrics.json").read_text())["auc"] == pytest.approx(_auc(epochs))
        assert f"{_auc(epochs):.4f}" in proc.stdout
        assert [line.split(": ")[1].split(" (")[0] for line in _state_lines(proc.stdout, record["run_id"])] == \
            ["PENDING", "RUNNING", "SUCCEEDED"]


def test_a_dry_run_sweep_compiles_every_job_and_contacts_no_server(tmp_path):
    with FakeKfpApi() as api:
        proc = _sweep(tmp_path, "cluster.submit=false", "cluster.wait=true", f"cluster.host={api.url}",
                      "ps.epochs=1,2", "checkpoint.uri=s3://bucket/x")
    assert proc.returncode == 0, proc.stderr
    assert api.requests == []
    for job, epochs in enumerate((1, 2)):
        job_dir = tmp_path / "sweep" / str(job)
        spec = next(yaml.safe_load_all((job_dir / "pipeline.yaml").read_text()))
        assert spec["root"]["inputDefinitions"]["parameters"]["epochs"]["defaultValue"] == epochs
        assert not any((job_dir / name).exists() for name in ("kubeflow_run.json", "metrics.json"))
    assert proc.stdout.count("cluster.submit=false: not submitted") == 2
