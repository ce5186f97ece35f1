"""The Kubernetes launcher and the run's cleanup against an HTTP Kubernetes API on loopback
(:mod:`tests.train.backends.kube_emulator`), through the real ``kubernetes`` client: objects created (and
validated against the CRDs of ../shared/schemas when it is there), followed by polling and watches, conditions
deciding the outcome, deletion, owner references and the run label. Each test plays the controllers over HTTP
too: it watches the job kind, creates the pods the controller would and patches the job's status.

The in-memory fakes of :mod:`tests.train.backends.test_kubernetes` cover what needs scripted timing (cut log
streams, restarts mid-run, SIGTERM)."""

import dataclasses
import datetime as dt
import json
import threading
import time
import uuid
from typing import Callable, Optional

import pytest

pytest.importorskip("kmock", reason="kmock (the HTTP Kubernetes API emulator, test extra) is not installed")

from components.checkpoint.lease import LEASE, StoreLease  # noqa: E402
from components.checkpoint.store import CheckpointStore  # noqa: E402
from components.config_rules import validate  # noqa: E402
from components.ps.contract import CONFIG_ERROR_EXIT, STORE_REFUSED_EXIT, STORE_REFUSED_PREFIX  # noqa: E402
from components.ps.liveness import HeartbeatRecord  # noqa: E402
from components.train.backends import manifests  # noqa: E402
from components.train.backends.kubernetes.api import KubeObject  # noqa: E402
from components.train.backends.kubernetes.cleanup import delete_pipeline_run_objects  # noqa: E402
from components.train.backends.kubernetes.lifecycle import KubernetesJob  # noqa: E402
from components.train.job import PsJobError, PsJobStoreError, prepare_job  # noqa: E402
from tests.conftest import needs_schemas  # noqa: E402
from tests.train.backends.crds import CRD_FILES, crd_schemas  # noqa: E402
from tests.train.backends.kube_controllers import job_pod  # noqa: E402
from tests.train.backends.kube_emulator import EmulatedCluster  # noqa: E402

NAMESPACE = "team-a"
DATA_URI = "s3://ctr/kfp/prepare/dataset"
BASELINE_URI = "s3://ctr/kfp/fit-baseline/baseline"  # the pipeline's fit-baseline step's: the model blends it in


def _prepared(cfg):
    """The job as the train step prepares it: with the fitted baseline's URL (model.blend_baseline)."""
    return dataclasses.replace(prepare_job(cfg, None), baseline=BASELINE_URI)
POLL_S = 0.05
LAUNCHER_POD = {"name": "ctr-run-train-x7k2p", "uid": "1b2c3d4e-0000-1111-2222-333344445555"}
PIPELINE_RUN = "8f14e45f-ceea-467f-a0e6-1b2c3d4e5f60"
BACKENDS = ["trainjob", "jobset", "paddlejob"]
# Each backend's job resource (group/version/plural) and what a controller writes in its status when it ends.
JOB_RESOURCE = {"trainjob": f"{manifests.TRAINER_API}/trainjobs", "jobset": f"{manifests.JOBSET_API}/jobsets",
                "paddlejob": f"{manifests.PADDLEJOB_API}/paddlejobs"}


def _conditions(kind: str, reason: str, message: str) -> dict:
    """A status holding one True condition, complete as a metav1.Condition is (the SDK parses it strictly)."""
    return {"conditions": [{"type": kind, "status": "True", "reason": reason, "message": message,
                            "lastTransitionTime": "2026-11-29T17:02:11Z"}]}


SUCCEEDED = {"trainjob": _conditions("Complete", "JobSetCompleted", "jobset completed"),
             "jobset": _conditions("Completed", "AllJobsCompleted", "jobset completed"),
             "paddlejob": {"phase": "Completed"}}
RESOURCES = {"TrainingRuntime": f"{manifests.TRAINER_API}/trainingruntimes",
             "NetworkPolicy": "networking.k8s.io/v1/networkpolicies", **{
                 kind: JOB_RESOURCE[backend] for backend, kind in
                 (("trainjob", "TrainJob"), ("jobset", "JobSet"), ("paddlejob", "PaddleJob"))}}


def _event(tag: str, **payload) -> str:
    return f"{tag} {json.dumps(payload)}"


EPOCH = _event("@epoch", epoch=1, examples=1000, seconds=1.5, auc=0.71)
CHECKPOINT = _event("@checkpoint", id="ckpt-1", epoch=1, uri="s3://ctr/ckpt")


@pytest.fixture
def cluster():
    with EmulatedCluster(crd_schemas()) as emulated:
        yield emulated


@pytest.fixture
def kubeconfig(cluster, tmp_path, monkeypatch):
    """A kubeconfig naming the emulator and the test's namespace, as a developer's machine has one; outside a pod."""
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulated",
        "clusters": [{"name": "emulated", "cluster": {"server": cluster.url}}],
        "users": [{"name": "developer", "user": {}}],
        "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "developer",
                                                      "namespace": NAMESPACE}}]}))
    monkeypatch.setenv("KUBECONFIG", str(path))
    # The client reads $KUBECONFIG once, when imported.
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return path


@pytest.fixture
def launcher_pod(monkeypatch):
    """The step's pod as the downward API describes it, in a Kubeflow run."""
    monkeypatch.setenv("POD_NAME", LAUNCHER_POD["name"])
    monkeypatch.setenv("POD_UID", LAUNCHER_POD["uid"])
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    monkeypatch.setenv(manifests.PIPELINE_RUN_ENV, PIPELINE_RUN)


def _cfg(config, backend: str, *overrides):
    # A controller that breaks shows as pods that never start, not as a test that hangs.
    cfg = config("+cluster=prod", "cluster.submit=false", f"checkpoint.uri=memory://ckpt-{uuid.uuid4().hex}",
                 "ps.servers=1", "ps.workers=2", f"cluster.backend={backend}", "cluster.start_timeout_s=30",
                 *overrides)
    validate(cfg)
    return cfg


def _launcher(cfg, tmp_path, cluster: EmulatedCluster, echoed: list) -> KubernetesJob:
    return KubernetesJob(_prepared(cfg), DATA_URI, tmp_path / "logs", echo=echoed.append, apis=cluster.apis(),
                         poll_s=POLL_S)


class PlayedController:
    """What a backend's controller does with a new job object, done over HTTP: pods created (as the
    controllers name and label them) with their log and final state, the job's status patched."""

    def __init__(self, cluster: EmulatedCluster, backend: str):
        self.cluster, self.backend, self.apis = cluster, backend, cluster.apis()
        self.group, self.version, self.plural = JOB_RESOURCE[backend].split("/")

    def runtime(self, body: dict) -> Optional[dict]:
        ref = body["spec"].get("runtimeRef")
        if not ref:
            return None
        if ref.get("kind") == "ClusterTrainingRuntime":
            return self.apis.custom.get_cluster_custom_object(manifests.TRAINER_GROUP, "v1alpha1",
                                                              "clustertrainingruntimes", ref["name"])
        return self.apis.custom.get_namespaced_custom_object(manifests.TRAINER_GROUP, "v1alpha1", NAMESPACE,
                                                             "trainingruntimes", ref["name"])

    def pod(self, body: dict, role: str, index: int, lines: tuple = (), exit_code: int = 0) -> str:
        """A pod of the job that ran to its end, ``exit_code``, having logged ``lines``; returns its name."""
        name, labels, container = job_pod(body, role, index, self.runtime(body))
        self.apis.core.create_namespaced_pod(NAMESPACE, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": container, "image": "ctr-ps:test"}]}})
        self.cluster.write_log(NAMESPACE, name, *lines)
        ended = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                 "finishedAt": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
        self.apis.core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [{"name": container, "image": "ctr-ps:test", "imageID": "", "ready": False,
                                   "restartCount": 0, "state": {"terminated": ended}}]}})
        return name

    def end(self, body: dict, status: dict) -> None:
        self.apis.custom.patch_namespaced_custom_object_status(self.group, self.version, NAMESPACE, self.plural,
                                                               body["metadata"]["name"], {"status": status})

    def control(self, on_created: Callable[["PlayedController", dict], None]) -> None:
        """``on_created(self, body)`` for each job object the watch sees created."""
        self.cluster.watch(JOB_RESOURCE[self.backend], NAMESPACE,
                           lambda kind, body: on_created(self, body) if kind == "ADDED" else None)


def _succeeds(controller: PlayedController, body: dict, server_logs: tuple = ((),)) -> None:
    """The job's pods ran and it succeeded; ``server_logs``: the lines of each server's log."""
    for index, lines in enumerate(server_logs):
        controller.pod(body, "ps", index, lines)
    controller.pod(body, "worker", 0, ("I1129 fleet init done", EPOCH, CHECKPOINT, _event("@done")))
    controller.pod(body, "worker", 1, (EPOCH,))  # only worker 0's log is followed
    controller.end(body, SUCCEEDED[controller.backend])


def _created(cluster: EmulatedCluster) -> list[dict]:
    """The bodies the launcher created, in order."""
    return [request.data for request in sorted(
        (r for resource in RESOURCES.values() for r in cluster.requests("POST", resource)), key=lambda r: r.id)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_job_is_created_followed_to_its_success_and_deleted(config, tmp_path, launcher_pod, cluster, backend):
    PlayedController(cluster, backend).control(_succeeds)
    echoed = []
    job = _launcher(_cfg(config, backend), tmp_path, cluster, echoed)
    result = job.run()

    assert [e["epoch"] for e in result.epochs] == [1] and [c["id"] for c in result.checkpoints] == ["ckpt-1"]
    assert "[worker-0] I1129 fleet init done" in echoed
    log = (tmp_path / "logs" / "worker-0.log").read_text().splitlines()
    assert log[1:] == ["I1129 fleet init done", EPOCH, CHECKPOINT, _event("@done")]
    kinds = {"trainjob": ["TrainingRuntime", "TrainJob"], "jobset": ["JobSet"], "paddlejob": ["PaddleJob"]}[backend]
    created = _created(cluster)  # each fit its CRD's schema, or the emulator would have refused it (422)
    assert [body["kind"] for body in created] == ["NetworkPolicy"] + kinds
    for kind in set(RESOURCES) & {"NetworkPolicy", *kinds}:
        assert cluster.objects(RESOURCES[kind]) == []
        (deleted,) = cluster.requests("DELETE", RESOURCES[kind])
        assert deleted.params["propagationPolicy"] == "Background"
    assert f"deleted {kinds[-1]} {job.job_name(0)}" in echoed


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_servers_logs_reach_the_steps_output_and_its_logs(config, tmp_path, launcher_pod, cluster, backend):
    servers = (("I1129 server 0: table loaded", "I1129 server 0: 10 pulls/s"), ("I1129 server 1: table loaded",))
    PlayedController(cluster, backend).control(lambda controller, body: _succeeds(controller, body, servers))
    echoed = []
    _launcher(_cfg(config, backend, "ps.servers=2"), tmp_path, cluster, echoed).run()
    for index, lines in enumerate(servers):  # each server's lines in order; the two streams may interleave
        assert [line for line in echoed if line.startswith(f"[server-{index}]")] == [
            f"[server-{index}] {line}" for line in lines]
    logs = tmp_path / "logs"
    assert (logs / "server-0.log").read_text().splitlines()[1:] == ["I1129 server 0: table loaded",
                                                                     "I1129 server 0: 10 pulls/s"]
    assert (logs / "server-1.log").read_text().splitlines()[1:] == ["I1129 server 1: table loaded"]


def test_a_long_run_name_names_the_job_within_the_host_name_limit(config, tmp_path, launcher_pod, cluster,
                                                                   monkeypatch):
    run_name = "ctr-ps-training-daily-criteo-terabyte-sweep-lr-0-05-x7k2pq9z"  # 60 characters
    monkeypatch.setenv(manifests.PIPELINE_RUN_NAME_ENV, run_name)
    PlayedController(cluster, "trainjob").control(_succeeds)
    job = _launcher(_cfg(config, "trainjob"), tmp_path, cluster, [])
    job.run()
    (trainjob,) = [body for body in _created(cluster) if body["kind"] == "TrainJob"]
    name = trainjob["metadata"]["name"]
    assert name == job.job_name(0) and name.startswith(run_name[:16]) and len(name) < len(run_name)
    longest = f"{name}-{manifests.TRAINER_NODE}-0-{job.cfg.ps.workers - 1}"
    assert len(longest) <= manifests.MAX_HOST_NAME


@pytest.mark.parametrize("backend", BACKENDS)
def test_created_objects_are_owned_by_the_step_pod_and_labelled_with_the_run(config, tmp_path, launcher_pod, cluster,
                                                                             backend):
    PlayedController(cluster, backend).control(_succeeds)
    _launcher(_cfg(config, backend), tmp_path, cluster, []).run()
    for body in _created(cluster):
        (owner,) = body["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", LAUNCHER_POD["name"], LAUNCHER_POD["uid"])
        assert owner["blockOwnerDeletion"] is False and body["metadata"]["namespace"] == NAMESPACE
        assert body["metadata"]["labels"][manifests.PIPELINE_RUN_LABEL] == PIPELINE_RUN


@pytest.mark.parametrize("backend", ["trainjob", "jobset"])
def test_a_failed_condition_fails_the_job_naming_its_reason_and_the_pod(config, tmp_path, launcher_pod, cluster,
                                                                        backend):
    def fails(controller, body):
        controller.pod(body, "ps", 0)
        controller.pod(body, "worker", 1, ("reading shards", "MemoryError: out of memory"), exit_code=1)
        controller.pod(body, "worker", 0, (EPOCH,), exit_code=143)  # stopped after worker 1 failed
        controller.end(body, _conditions("Failed", "FailedJobs", "jobset failed: reached max restarts"))

    PlayedController(cluster, backend).control(fails)
    with pytest.raises(PsJobError) as failed:
        _launcher(_cfg(config, backend), tmp_path, cluster, []).run()
    message = str(failed.value)
    assert failed.value.role == "worker-1" and "also failed: worker-0" in message
    assert "FailedJobs: jobset failed: reached max restarts" in message and "exited with code" in message
    assert "    MemoryError: out of memory" in message
    assert all(cluster.objects(resource) == [] for resource in RESOURCES.values())


def test_a_failed_paddlejob_is_deleted_and_created_again_under_a_new_name(config, tmp_path, launcher_pod, cluster):
    def first_fails(controller, body):
        if body["metadata"]["name"].endswith("-r1"):
            return _succeeds(controller, body)
        controller.pod(body, "worker", 1, ("RuntimeError: brpc timeout",), exit_code=1)
        controller.end(body, {"phase": "Failed"})

    PlayedController(cluster, "paddlejob").control(first_fails)
    job = _launcher(_cfg(config, "paddlejob", "cluster.max_restarts=1"), tmp_path, cluster, [])
    result = job.run()
    assert [c["id"] for c in result.checkpoints] == ["ckpt-1"]
    names = [body["metadata"]["name"] for body in _created(cluster) if body["kind"] == "PaddleJob"]
    assert names == [job.job_name(0), job.job_name(1)]
    assert [r.name for r in cluster.requests("DELETE", JOB_RESOURCE["paddlejob"])] == names
    assert cluster.objects(JOB_RESOURCE["paddlejob"]) == []


def test_a_configuration_error_is_not_restarted(config, tmp_path, launcher_pod, cluster):
    def config_error(controller, body):
        controller.pod(body, "worker", 0, ("configuration error: ps.workers",), exit_code=CONFIG_ERROR_EXIT)
        controller.end(body, {"phase": "Failed"})

    PlayedController(cluster, "paddlejob").control(config_error)
    with pytest.raises(PsJobError, match="a configuration error: restarting cannot mend it"):
        _launcher(_cfg(config, "paddlejob", "cluster.max_restarts=2"), tmp_path, cluster, []).run()
    assert len(cluster.requests("POST", JOB_RESOURCE["paddlejob"])) == 1


def test_a_store_refusal_is_not_restarted_and_says_the_stores_reason(config, tmp_path, launcher_pod, cluster):
    refusal = f"{STORE_REFUSED_PREFIX}writing s3://b/ctr/_upload/w0.npz: AccessDenied"

    def store_refused(controller, body):
        controller.pod(body, "worker", 0, ("training pass 1", refusal), exit_code=STORE_REFUSED_EXIT)
        controller.end(body, {"phase": "Failed"})

    PlayedController(cluster, "paddlejob").control(store_refused)
    with pytest.raises(PsJobStoreError) as failed:
        _launcher(_cfg(config, "paddlejob", "cluster.max_restarts=2"), tmp_path, cluster, []).run()
    assert refusal in str(failed.value) and "\n" not in str(failed.value)
    assert len(cluster.requests("POST", JOB_RESOURCE["paddlejob"])) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_job_whose_store_lease_is_taken_over_is_deleted_and_fails_the_step_in_one_line(
        config, tmp_path, launcher_pod, cluster, backend):
    """Another run takes the checkpoint store's lease over while the job runs (this one's renewals stalled past
    its expiry): the launcher deletes the job at once, and the step fails naming the store and the new holder, so
    that this job never writes into a store another run now prunes."""
    PlayedController(cluster, backend).control(lambda controller, body: None)  # the job runs until deleted
    cfg = _cfg(config, backend)
    store = CheckpointStore(cfg.checkpoint.uri)
    job = _prepared(cfg)
    with StoreLease(store, job.run_id, renew_s=0.05) as lease:
        launcher = KubernetesJob(job, DATA_URI, tmp_path / "logs", echo=[].append, apis=cluster.apis(), poll_s=POLL_S,
                                 lease=lease)
        threading.Timer(0.5, lambda: store.write_json(None, LEASE, {
            "run_id": "other-run", "token": "theirs", "host": "elsewhere", "pid": 1, "renewed_at": time.time(),
            "ttl_s": 60})).start()
        with pytest.raises(PsJobStoreError) as failed:
            launcher.run()
    message = str(failed.value)
    assert "\n" not in message and "taken over by run other-run" in message and launcher.base_name in message
    assert "its Kubernetes objects are deleted" in message
    assert cluster.objects(JOB_RESOURCE[backend]) == [] and cluster.objects(RESOURCES["NetworkPolicy"]) == []


class BeatingRoles:
    """The roles of each job object the controller sees created, running (their pods' phase Running) and writing
    heartbeat records into the job's checkpoint store every 0.1 s as the real roles do
    (:class:`components.ps.liveness.HeartbeatRecord`), until the test stops them: ``silent`` names a role whose
    records stop changing after its first in the attempts listed (a hung worker)."""

    def __init__(self, controller: PlayedController, store: CheckpointStore, servers: int, workers: int,
                 silent: dict[int, str], succeed_after_s: Optional[float] = None):
        self.controller, self.store, self.servers, self.workers = controller, store, servers, workers
        self.silent, self.succeed_after_s = silent, succeed_after_s
        self.attempts: list[str] = []
        self.stop = threading.Event()

    def __call__(self, controller: PlayedController, body: dict) -> None:
        attempt, name = len(self.attempts), body["metadata"]["name"]
        self.attempts.append(name)
        roles = [("server", i) for i in range(self.servers)] + [("worker", i) for i in range(self.workers)]
        records = {(role, i): HeartbeatRecord(self.store, role, i, name) for role, i in roles}
        pods = []
        for role, i in roles:
            pod, labels, container = job_pod(body, "ps" if role == "server" else role, i, controller.runtime(body))
            controller.apis.core.create_namespaced_pod(NAMESPACE, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "labels": labels},
                "spec": {"containers": [{"name": container, "image": "ctr-ps:test"}]}})
            controller.apis.core.patch_namespaced_pod_status(pod, NAMESPACE, {"status": {"phase": "Running"}})
            pods.append(pod)
        threading.Thread(target=self._beat, args=(attempt, body, records, pods), daemon=True).start()

    def _beat(self, attempt: int, body: dict, records: dict, pods: list[str]) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            for (role, i), record in records.items():
                if f"{role}-{i}" != self.silent.get(attempt) or record.seq == 0:
                    record.write(progress={"epoch": 1, "examples": 100 * record.seq} if role == "worker" else None)
            if self.succeed_after_s is not None and time.monotonic() - started > self.succeed_after_s \
                    and attempt not in self.silent:
                for i in range(self.workers):
                    records["worker", i].write(done=True)
                for pod in pods:  # ended: their logs are read to their end
                    self.controller.apis.core.patch_namespaced_pod_status(pod, NAMESPACE,
                                                                          {"status": {"phase": "Succeeded"}})
                self.controller.end(body, SUCCEEDED[self.controller.backend])
                return
            time.sleep(0.1)


def _liveness_cfg(config, backend: str, *overrides):
    """Roles beat every second (the least ps.progress_period_s) and stall after 3 s of silence."""
    return _cfg(config, backend, "ps.progress_period_s=1", "ps.stall_timeout_s=3", "ps.startup_timeout_s=5",
                *overrides)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_whose_heartbeat_stops_has_the_job_deleted_and_created_again_from_scratch(
        config, tmp_path, launcher_pod, cluster, backend):
    """Worker 1 hangs (its pod still Running, its heartbeat record no longer changes): no kind's own restart policy
    sees that, the launcher does, from the store; it deletes the job, creates it again under a new name, says
    what the restart cost, and the second attempt succeeds."""
    cfg = _liveness_cfg(config, backend, "cluster.max_restarts=1")
    controller = PlayedController(cluster, backend)
    roles = BeatingRoles(controller, CheckpointStore(cfg.checkpoint.uri), 1, 2, silent={0: "worker-1"},
                         succeed_after_s=1.5)
    controller.control(roles)
    echoed = []
    job = _launcher(cfg, tmp_path, cluster, echoed)
    try:
        job.run()
    finally:
        roles.stop.set()
    assert roles.attempts == [job.job_name(0), job.job_name(1)]
    (restart,) = job.restarts
    assert restart.role == "worker-1" and restart.what.startswith("reported nothing for ")
    line = next(line for line in echoed if line.startswith("restart 1 of 1: "))
    assert f"PS job {job.base_name}: worker-1 reported nothing for" in line
    assert "attempt 2 of 2 starting from scratch again; at least " in line and " examples to train again" in line
    assert restart.examples_again > 0  # what the workers' records said they trained before the restart
    assert [r.name for r in cluster.requests("DELETE", JOB_RESOURCE[backend])] == roles.attempts
    assert cluster.objects(JOB_RESOURCE[backend]) == [] and cluster.objects(RESOURCES["NetworkPolicy"]) == []


@pytest.mark.parametrize("backend", ["trainjob", "paddlejob"])
def test_a_worker_whose_heartbeat_stops_with_no_restart_left_fails_the_step_in_one_line_with_status_4(
        config, tmp_path, launcher_pod, cluster, backend):
    from pipelines.errors import ExitStatus, user_error

    cfg = _liveness_cfg(config, backend, "cluster.max_restarts=0")
    controller = PlayedController(cluster, backend)
    roles = BeatingRoles(controller, CheckpointStore(cfg.checkpoint.uri), 1, 2, silent={0: "worker-1"})
    controller.control(roles)
    job = _launcher(cfg, tmp_path, cluster, [])
    try:
        with pytest.raises(PsJobError) as failed:
            job.run()
    finally:
        roles.stop.set()
    status, line = user_error(failed.value)
    assert status is ExitStatus.JOB_FAILED and failed.value.role == "worker-1"
    assert line.startswith(f"PS job {job.job_name(0)}: worker-1 reported nothing for ") and "stopped or hung" in line
    assert roles.attempts == [job.job_name(0)] and cluster.objects(JOB_RESOURCE[backend]) == []


def test_a_watch_sees_the_trainjob_created_ended_and_deleted(config, tmp_path, launcher_pod, cluster):
    events = []
    PlayedController(cluster, "trainjob").control(_succeeds)
    cluster.watch(JOB_RESOURCE["trainjob"], NAMESPACE, lambda kind, body: events.append((kind, body.get("status"))))
    _launcher(_cfg(config, "trainjob"), tmp_path, cluster, []).run()
    _wait_for(lambda: events and events[-1][0] == "DELETED")
    assert events == [("ADDED", None), ("MODIFIED", SUCCEEDED["trainjob"]), ("DELETED", SUCCEEDED["trainjob"])]


def _wait_for(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@needs_schemas
def test_the_emulator_refuses_what_a_crd_refuses(config, cluster):
    from kubernetes.client.exceptions import ApiException

    assert set(cluster.emulator.schemas) == set(CRD_FILES)
    jobset = manifests.job_manifests(prepare_job(_cfg(config, "jobset"), None), name="ctr-ps-broken",
                                     namespace=NAMESPACE, data_uri=DATA_URI)[-1]
    jobset["spec"]["replicatedJobs"][0]["replicas"] = "two"
    with pytest.raises(ApiException) as refused:
        KubeObject.of(jobset).create(cluster.apis(), jobset)
    assert refused.value.status == 422 and "'two' is not of type 'integer'" in refused.value.body


def _run_objects(cfg, pipeline_run: str) -> list[dict]:
    return manifests.job_manifests(prepare_job(cfg, None), name=f"ctr-ps-{uuid.uuid4().hex[:8]}",
                                   namespace=NAMESPACE, data_uri=DATA_URI, pipeline_run=pipeline_run)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_exit_handler_deletes_what_its_run_left_and_nothing_else(config, monkeypatch, cluster, backend):
    cfg, apis = _cfg(config, backend), cluster.apis()
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    left, other = _run_objects(cfg, PIPELINE_RUN), _run_objects(cfg, "another-run")
    for body in left + other:
        KubeObject.of(body).create(apis, body)

    deleted = delete_pipeline_run_objects(cfg.cluster, PIPELINE_RUN, apis=apis, echo=lambda line: None)
    assert deleted == [str(KubeObject.of(body)) for body in reversed(left)]  # the job first
    remaining = [body["metadata"]["name"] for resource in RESOURCES.values() for body in cluster.objects(resource)]
    assert sorted(remaining) == sorted(body["metadata"]["name"] for body in other)
    assert delete_pipeline_run_objects(cfg.cluster, PIPELINE_RUN, apis=apis, echo=lambda line: None) == []


def test_the_exit_component_deletes_its_runs_objects_as_the_pod_sees_the_cluster(config, monkeypatch, cluster,
                                                                                 kubeconfig):
    """The exit handler's component as KFP runs it: its function, given the compiled-in cluster settings, in a pod
    whose env names its namespace and run (the downward API), acting as the kubeconfig's user here."""
    from components.cleanup.component import clean_up_run
    from components.resolve.step import config_struct

    cfg = _cfg(config, "jobset")
    left, other = _run_objects(cfg, PIPELINE_RUN), _run_objects(cfg, "another-run")
    for body in left + other:
        KubeObject.of(body).create(cluster.apis(), body)
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    monkeypatch.setenv(manifests.PIPELINE_RUN_ENV, PIPELINE_RUN)
    deleted = clean_up_run.python_func(cluster=config_struct(cfg)["cluster"])
    assert deleted == [str(KubeObject.of(body)) for body in reversed(left)]
    remaining = [body["metadata"]["name"] for resource in RESOURCES.values() for body in cluster.objects(resource)]
    assert sorted(remaining) == sorted(body["metadata"]["name"] for body in other)


def test_the_exit_handler_reads_the_run_from_the_pod_and_needs_one(config, monkeypatch, cluster):
    cfg, apis = _cfg(config, "paddlejob"), cluster.apis()
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    with pytest.raises(ValueError, match=manifests.PIPELINE_RUN_ENV):
        delete_pipeline_run_objects(cfg.cluster, apis=apis)
    monkeypatch.setenv(manifests.PIPELINE_RUN_ENV, PIPELINE_RUN)
    del cluster.emulator.resources[JOB_RESOURCE["paddlejob"]]  # a cluster without paddle-operator: nothing to find
    assert delete_pipeline_run_objects(cfg.cluster, apis=apis, echo=lambda line: None) == []
