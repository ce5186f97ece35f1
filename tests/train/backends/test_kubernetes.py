"""The Kubernetes launcher's lifecycle against an in-memory Kubernetes API that plays the JobSet / PaddleJob
controllers: objects created and always deleted, worker 0's log streamed (across restarts and cut streams),
failures named, cancellation by SIGTERM, PaddleJob relaunches. The manifests are the real ones."""

import datetime as dt
import json
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Callable, Optional

import pytest
from kubernetes.client import (V1Container, V1ContainerState, V1ContainerStateRunning, V1ContainerStateTerminated,
                               V1ContainerStateWaiting, V1ContainerStatus, V1ObjectMeta, V1Pod, V1PodList, V1PodSpec, V1PodStatus)
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from components.config import validate
from components.ps.contract import RESTART_ENV
from components.train import step
from components.train.backends import kubernetes as kubernetes_job
from components.train.backends import manifests
from components.train.backends.kubernetes import JobCancelled, KubeApis, KubernetesJob
from components.train.job import PsJobError, prepare_job

NAMESPACE = "team-a"
DATA_URI = "s3://ctr/kfp/prepare/dataset"
POLL_S = 0.01
COMPLETED = {"conditions": [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}]}
JOBSET_FAILED = {"conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs",
                                 "message": "jobset failed: reached max restarts"}]}


def _cfg(config, *overrides):
    cfg = config("+cluster=prod", "cluster.submit=false", f"checkpoint.uri=memory://ckpt-{uuid.uuid4().hex}",
                  "ps.servers=1", "ps.workers=2", *overrides)
    validate(cfg)
    return cfg


def _event(tag: str, **payload) -> str:
    return f"{tag} {json.dumps(payload)}"


def _epoch(n: int) -> str:
    return _event("@epoch", epoch=n, examples=1000 * n, seconds=1.5, auc=0.7 + n / 100)


def _checkpoint(n: int) -> str:
    return _event("@checkpoint", id=f"ckpt-{n}", epoch=n, uri="s3://ctr/ckpt")


def _rfc3339nano(t: dt.datetime) -> str:
    """How the kubelet stamps log lines: RFC 3339 with nanoseconds, trailing zeros trimmed."""
    fraction = f"{t.microsecond * 1000:09d}".rstrip("0")
    return f"{t:%Y-%m-%dT%H:%M:%S}" + (f".{fraction}" if fraction else "") + "Z"


class FakePod:
    def __init__(self, cluster: "FakeCluster", name: str, labels: dict, container: str):
        self.cluster, self.name, self.labels, self.container = cluster, name, labels, container
        self.uid = str(uuid.uuid4())
        self.created = cluster.now()
        self.phase = "Running"
        self.exit_code: Optional[int] = None
        self.reason: Optional[str] = None
        self.finished_at: Optional[dt.datetime] = None
        self.lines: list[tuple[str, str]] = []  # (timestamp, text)
        self.gone = False
        self.follows = 0  # log streams opened
        self.cut_first_stream_after: Optional[int] = None  # the first stream breaks after this many lines
        self.on_read_to_end: Optional[Callable[[], None]] = None  # once: a stream delivered every line so far
        self.cond = threading.Condition()

    def log(self, *texts: str, one_write: bool = False) -> "FakePod":
        """Append lines; ``one_write``: they share one timestamp, as lines of one write do."""
        stamp = _rfc3339nano(self.cluster.now())
        with self.cond:
            for text in texts:
                self.lines.append((stamp, text))
                if not one_write:
                    stamp = _rfc3339nano(self.cluster.now())
            self.cond.notify_all()
        return self

    def end(self, exit_code: int = 0, reason: Optional[str] = None) -> "FakePod":
        with self.cond:
            self.phase = "Succeeded" if exit_code == 0 else "Failed"
            self.exit_code, self.reason, self.finished_at = exit_code, reason, self.cluster.now()
            self.cond.notify_all()
        return self

    def model(self) -> V1Pod:
        ended = self.phase in ("Succeeded", "Failed")
        if self.phase == "Pending":  # ``reason``: why its container waits (ImagePullBackOff, ...)
            state = V1ContainerState(waiting=V1ContainerStateWaiting(reason=self.reason, message="back-off pulling"))
        elif ended:
            state = V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=self.exit_code, reason=self.reason,
                                                                           finished_at=self.finished_at))
        else:
            state = V1ContainerState(running=V1ContainerStateRunning(started_at=self.created))
        status = V1ContainerStatus(name=self.container, image="img", image_id="img@sha256:0", ready=not ended,
                                   restart_count=0, state=state)
        return V1Pod(metadata=V1ObjectMeta(name=self.name, namespace=NAMESPACE, uid=self.uid, labels=self.labels,
                                           creation_timestamp=self.created),
                     spec=V1PodSpec(containers=[V1Container(name=self.container)]),
                     status=V1PodStatus(phase=self.phase, container_statuses=[status]))


class FakeLogStream:
    """``read_namespaced_pod_log(follow=True, _preload_content=False)``: urllib3-like ``stream()`` of byte
    chunks (not aligned to lines) that ends when the container has ended, or breaks when scripted to."""

    def __init__(self, pod: FakePod, timestamps: bool, cut_after: Optional[int]):
        self.pod, self.timestamps, self.cut_after = pod, timestamps, cut_after
        self.closed = False

    def stream(self, amt=None, decode_content=None):
        pod, sent = self.pod, 0
        while True:
            callback = None
            with pod.cond:
                while (not self.closed and not pod.gone and sent >= len(pod.lines) and pod.phase == "Running"
                       and pod.on_read_to_end is None):
                    pod.cond.wait(0.05)
                if self.closed or pod.gone:
                    return
                if sent >= len(pod.lines):
                    if pod.phase != "Running":
                        return
                    callback, pod.on_read_to_end = pod.on_read_to_end, None
                else:
                    stamp, text = pod.lines[sent]
            if callback:
                callback()
                continue
            if self.cut_after is not None and sent >= self.cut_after:
                raise ProtocolError("Connection broken: IncompleteRead")
            sent += 1
            data = (f"{stamp} {text}\n" if self.timestamps else f"{text}\n").encode()
            yield data[:len(data) // 2]
            yield data[len(data) // 2:]

    def close(self):
        with self.pod.cond:
            self.closed = True
            self.pod.cond.notify_all()

    def release_conn(self):
        pass


def _pod_templates(body: dict) -> dict[str, dict]:
    if body["kind"] == "JobSet":
        return {rj["name"]: rj["template"]["spec"]["template"] for rj in body["spec"]["replicatedJobs"]}
    return {key: body["spec"][key]["template"] for key in ("ps", "worker")}


def _matches(labels: dict, selector: str) -> bool:
    return all(labels.get(key) == value for key, value in (term.split("=", 1) for term in selector.split(",")))


class FakeCluster:
    """CustomObjectsApi + CoreV1Api + NetworkingV1Api, in memory. ``on_create(cluster, body)`` plays the
    controller when a job object is created; ``statuses[name]()`` is its status at each read."""

    def __init__(self, on_create: Callable[["FakeCluster", dict], None]):
        self.on_create = on_create
        self.objects: dict[tuple[str, str], dict] = {}
        self.created: list[tuple[str, str]] = []
        self.deleted: list[tuple[str, str, str]] = []  # kind, name, propagation
        self.statuses: dict[str, Callable[[], dict]] = {}
        self.pods: list[FakePod] = []
        self.get_hook: Optional[Callable[[], None]] = None
        self._clock = dt.datetime(2026, 11, 29, 16, 45, 19, tzinfo=dt.timezone.utc)
        self._lock = threading.Lock()

    def apis(self) -> KubeApis:
        return KubeApis(custom=self, core=self, networking=self)

    def now(self) -> dt.datetime:
        with self._lock:  # 50 ms steps: stamps like .95, .1, .15 and whole seconds, as the kubelet trims them
            self._clock += dt.timedelta(milliseconds=50)
            return self._clock

    def add_pod(self, body: dict, role: str, index: int) -> FakePod:
        """A pod as the controller names and labels it."""
        name = body["metadata"]["name"]
        template = _pod_templates(body)[role]
        labels = dict(template["metadata"]["labels"])
        if body["kind"] == "JobSet":
            pod_name = f"{name}-{role}-{index}-0-{uuid.uuid4().hex[:5]}"
            labels.update({"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": role,
                           "jobset.sigs.k8s.io/job-index": str(index)})
        else:
            pod_name = f"{name}-{role}-{index}"
            labels["paddle-res-name"] = pod_name
        pod = FakePod(self, pod_name, labels, template["spec"]["containers"][0]["name"])
        self.pods.append(pod)
        return pod

    # CustomObjectsApi
    def create_namespaced_custom_object(self, group, version, namespace, plural, body, **_):
        assert (f"{group}/{version}", namespace, plural) == (body["apiVersion"], NAMESPACE, body["kind"].lower() + "s")
        self._store(body)
        self.on_create(self, body)

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
        if self.get_hook:
            self.get_hook()
        if (plural, name) not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return {**self.objects[(plural, name)], "status": self.statuses.get(name, dict)()}

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, propagation_policy=None, **_):
        self._delete(plural, name, propagation_policy)
        for pod in self.pods:  # the garbage collector removes the job's pods
            if pod.labels.get(manifests.JOB_LABEL) == name:
                with pod.cond:
                    pod.gone = True
                    pod.cond.notify_all()

    # NetworkingV1Api
    def create_namespaced_network_policy(self, namespace, body, **_):
        assert namespace == NAMESPACE
        self._store(body)

    def delete_namespaced_network_policy(self, name, namespace, propagation_policy=None, **_):
        self._delete("networkpolicies", name, propagation_policy)

    # CoreV1Api
    def list_namespaced_pod(self, namespace, label_selector, **_):
        return V1PodList(items=[p.model() for p in self.pods if not p.gone and _matches(p.labels, label_selector)])

    def read_namespaced_pod_log(self, name, namespace, container=None, follow=False, timestamps=False,
                                tail_lines=None, _preload_content=True, **_):
        pod = next(p for p in self.pods if p.name == name and not p.gone)
        assert container == pod.container
        if follow:
            assert not _preload_content
            pod.follows += 1
            return FakeLogStream(pod, timestamps, pod.cut_first_stream_after if pod.follows == 1 else None)
        return "".join(f"{text}\n" for _, text in pod.lines[-tail_lines:])

    def _store(self, body: dict) -> None:
        plural = "networkpolicies" if body["kind"] == "NetworkPolicy" else body["kind"].lower() + "s"
        self.objects[(plural, body["metadata"]["name"])] = body
        self.created.append((body["kind"], body["metadata"]["name"]))

    def _delete(self, plural: str, name: str, propagation: Optional[str]) -> None:
        body = self.objects.pop((plural, name), None)
        if body is None:
            raise ApiException(status=404, reason="Not Found")
        self.deleted.append((body["kind"], name, propagation))


def _succeeding_controller(bodies: list[dict]) -> Callable[[FakeCluster, dict], None]:
    """A controller whose job succeeds at once (worker 0 exits 0); it keeps the bodies it was given."""

    def controller(cluster, body):
        bodies.append(body)
        cluster.add_pod(body, "worker", 0).end(0)
        cluster.statuses[body["metadata"]["name"]] = lambda: COMPLETED

    return controller


def _launcher(cfg, tmp_path, cluster: FakeCluster, echoed: list[str]) -> KubernetesJob:
    return KubernetesJob(prepare_job(cfg, None), DATA_URI, tmp_path / "logs", echo=echoed.append, apis=cluster.apis(),
                         poll_s=POLL_S)


def _log_lines(tmp_path) -> list[str]:
    return (tmp_path / "logs" / "worker-0.log").read_text().splitlines()


@pytest.fixture
def launcher_pod(monkeypatch):
    """The step's pod as the downward API describes it."""
    monkeypatch.setenv("POD_NAME", "ctr-run-train-x7k2p")
    monkeypatch.setenv("POD_UID", "1b2c3d4e-0000-1111-2222-333344445555")
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)


def test_success_streams_worker0_returns_its_events_and_deletes_the_objects(config, tmp_path, launcher_pod):
    cfg = _cfg(config)
    progress = _event("@progress", role="worker", index=0, epoch=1, examples=500, examples_per_s=250.0,
                      loss=0.5, auc=0.68)

    def controller(cluster, body):
        worker0 = cluster.add_pod(body, "worker", 0)
        worker0.log(progress, "I1129 fleet init done", _epoch(1), _checkpoint(1), _event("@done")).end(0)
        cluster.add_pod(body, "worker", 1).log(_epoch(1)).end(0)  # only worker 0's log is followed
        cluster.add_pod(body, "ps", 0).end(0)
        cluster.statuses[body["metadata"]["name"]] = lambda: COMPLETED  # before worker 0's log is read

    cluster, echoed = FakeCluster(controller), []
    job = _launcher(cfg, tmp_path, cluster, echoed)
    result = job.run()

    assert result.epochs == [json.loads(_epoch(1).partition(" ")[2])]
    assert [c["id"] for c in result.checkpoints] == ["ckpt-1"]
    assert job.events.progress["worker-0"]["examples"] == 500
    assert result.restored_from is None
    assert _log_lines(tmp_path)[1:] == [progress, "I1129 fleet init done", _epoch(1), _checkpoint(1), _event("@done")]
    assert "[worker-0] I1129 fleet init done" in echoed
    assert any(line.startswith("== epoch 1 done: 1,000 examples") for line in echoed)
    assert "== checkpoint ckpt-1 committed to s3://ctr/ckpt" in echoed

    name = job.job_name(0)
    assert cluster.created == [("NetworkPolicy", f"{name}-ps"), ("JobSet", name)]
    assert cluster.deleted == [("JobSet", name, "Background"), ("NetworkPolicy", f"{name}-ps", "Background")]
    assert cluster.objects == {}
    assert len(f"{name}-worker-{cfg.ps.workers - 1}-0") <= 63  # worker pods' hostnames


def test_objects_are_owned_by_the_launcher_pod(config, tmp_path, launcher_pod):
    bodies = []
    controller = _succeeding_controller(bodies)
    _launcher(_cfg(config), tmp_path, FakeCluster(controller), []).run()
    (jobset,) = bodies
    assert jobset["metadata"]["namespace"] == NAMESPACE
    (owner,) = jobset["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "ctr-run-train-x7k2p",
                                                            "1b2c3d4e-0000-1111-2222-333344445555")


def test_worker_failure_names_the_pod_that_failed_first_and_quotes_its_log(config, tmp_path, launcher_pod):
    def controller(cluster, body):
        worker0 = cluster.add_pod(body, "worker", 0).log(_epoch(1))  # listed first, fails second
        worker1 = cluster.add_pod(body, "worker", 1)
        worker1.log("reading shards", "Traceback (most recent call last):", "MemoryError: out of memory")
        worker1.end(1, "Error")
        worker0.end(143, "Error")  # stopped after worker 1 failed
        cluster.add_pod(body, "ps", 0)
        cluster.statuses[body["metadata"]["name"]] = lambda: JOBSET_FAILED

    cluster, echoed = FakeCluster(controller), []
    with pytest.raises(PsJobError) as failed:
        _launcher(_cfg(config), tmp_path, cluster, echoed).run()
    assert failed.value.role == "worker-1"
    message = str(failed.value)
    assert "worker-1 (pod " in message and "exited with code 1 (Error)" in message
    assert "reached max restarts" in message and "also failed: worker-0" in message
    assert "    MemoryError: out of memory" in message and "    Traceback (most recent call last):" in message
    assert cluster.objects == {} and len(cluster.deleted) == 2


def test_sigterm_deletes_the_job_raises_cancelled_and_restores_the_handler(config, tmp_path, launcher_pod):
    def controller(cluster, body):
        cluster.add_pod(body, "ps", 0)
        cluster.add_pod(body, "worker", 0).log(_epoch(1))  # runs until deleted; the job never ends
        cluster.statuses[body["metadata"]["name"]] = dict

    def previous_handler(signum, frame):
        raise AssertionError("the launcher's handler should have been active")

    cluster = FakeCluster(controller)
    original = signal.signal(signal.SIGTERM, previous_handler)
    try:
        # SIGTERM arrives while run() polls in the main thread, once worker 0's log is streaming
        sender = threading.Thread(target=lambda: (_wait_for(lambda: cluster.pods and cluster.pods[-1].follows),
                                                  os.kill(os.getpid(), signal.SIGTERM)))
        sender.start()
        with pytest.raises(JobCancelled, match="cancelled \\(SIGTERM\\)"):
            _launcher(_cfg(config), tmp_path, cluster, []).run()
        sender.join()
        assert signal.getsignal(signal.SIGTERM) is previous_handler
    finally:
        signal.signal(signal.SIGTERM, original)
    assert cluster.objects == {} and {kind for kind, _, _ in cluster.deleted} == {"JobSet", "NetworkPolicy"}
    assert not any(t.name == "worker-0-log" and t.is_alive() for t in threading.enumerate())
    assert _log_lines(tmp_path)[1:] == [_epoch(1)]


def test_keyboard_interrupt_deletes_the_job(config, tmp_path, launcher_pod):
    polls = []

    def controller(cluster, body):
        cluster.statuses[body["metadata"]["name"]] = dict

    def interrupt_on_third_poll():
        polls.append(1)
        if len(polls) == 3:
            raise KeyboardInterrupt

    cluster = FakeCluster(controller)
    cluster.get_hook = interrupt_on_third_poll
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        _launcher(_cfg(config), tmp_path, cluster, []).run()
    assert cluster.objects == {} and len(cluster.deleted) == 2
    assert signal.getsignal(signal.SIGTERM) is handler


def test_a_cut_log_stream_is_reattached_without_losing_or_repeating_lines(config, tmp_path, launcher_pod):
    first = ["starting", _epoch(1), "line a", "line b", "line c"]
    later = [_checkpoint(1), _epoch(2), _checkpoint(2)]

    def controller(cluster, body):
        worker0 = cluster.add_pod(body, "worker", 0)
        worker0.log(*first[:2]).log(*first[2:], one_write=True)
        worker0.cut_first_stream_after = 3  # breaks inside the lines that share one timestamp
        name = body["metadata"]["name"]

        def finish():  # once the re-attached stream caught up: the rest of the run
            worker0.log(*later).end(0)
            cluster.statuses[name] = lambda: COMPLETED

        worker0.on_read_to_end = lambda: finish() if worker0.follows >= 2 else None
        cluster.statuses[name] = dict

    cluster, echoed = FakeCluster(controller), []
    result = _launcher(_cfg(config), tmp_path, cluster, echoed).run()
    assert _log_lines(tmp_path)[1:] == first + later
    assert [e["epoch"] for e in result.epochs] == [1, 2]
    assert [c["id"] for c in result.checkpoints] == ["ckpt-1", "ckpt-2"]
    assert [line for line in echoed if line.startswith("[worker-0]")] == [
        "[worker-0] starting", "[worker-0] line a",
        "[worker-0] reading its log failed (ProtocolError: Connection broken: IncompleteRead); retrying",
        "[worker-0] line b", "[worker-0] line c"]


def test_jobset_restart_follows_the_new_worker0_pod(config, tmp_path, launcher_pod):
    def controller(cluster, body):
        name = body["metadata"]["name"]
        attempt1 = cluster.add_pod(body, "worker", 0).log(_epoch(1), _checkpoint(1))
        polls_after_restart = []

        def after_restart():
            polls_after_restart.append(1)
            done = len(polls_after_restart) > 1 and attempt2.follows > 0
            return {"restarts": 1, **(COMPLETED if done else {})}

        def restart():  # worker 0 fails after its first checkpoint; JobSet recreates the pods
            nonlocal attempt2
            attempt1.end(1, "Error")
            attempt2 = cluster.add_pod(body, "worker", 0).log("resuming from ckpt-1", _epoch(2), _checkpoint(2)).end(0)
            cluster.statuses[name] = after_restart

        attempt2 = None
        attempt1.on_read_to_end = restart
        cluster.statuses[name] = dict

    cluster, echoed = FakeCluster(controller), []
    job = _launcher(_cfg(config), tmp_path, cluster, echoed)
    result = job.run()
    assert [e["epoch"] for e in result.epochs] == [1, 2]
    assert [c["id"] for c in result.checkpoints] == ["ckpt-1", "ckpt-2"]
    headers = [line for line in _log_lines(tmp_path) if line.startswith("----- pod")]
    assert headers == [f"----- pod {cluster.pods[0].name} -----", f"----- pod {cluster.pods[1].name} -----"]
    assert f"JobSet {job.job_name(0)}: restarted 1 time(s); the roles resume from the latest checkpoint" in echoed


def _paddlejob_controller(fail_attempts: int, restart_env: list[str]):
    """A PaddleJob whose first ``fail_attempts`` attempts fail in worker 1; records each attempt's PS_RESTART_ATTEMPT."""

    def controller(cluster, body):
        name = body["metadata"]["name"]
        env = {e["name"]: e.get("value") for e in _pod_templates(body)["worker"]["spec"]["containers"][0]["env"]}
        restart_env.append(env[RESTART_ENV])
        if len(restart_env) <= fail_attempts:
            cluster.add_pod(body, "worker", 1).log("connecting to servers", "RuntimeError: brpc timeout").end(1, "Error")
            cluster.statuses[name] = lambda: {"phase": "Failed"}
        else:
            cluster.add_pod(body, "worker", 0).log(_epoch(1), _checkpoint(1)).end(0)
            cluster.statuses[name] = lambda: {"phase": "Completed"}

    return controller


def test_paddlejob_is_recreated_after_a_failure_with_the_next_attempt(config, tmp_path, launcher_pod):
    restart_env = []
    cluster, echoed = FakeCluster(_paddlejob_controller(1, restart_env)), []
    job = _launcher(_cfg(config, "cluster.backend=paddlejob", "cluster.max_restarts=2"), tmp_path, cluster, echoed)
    result = job.run()
    assert restart_env == ["0", "1"]
    assert [name for kind, name in cluster.created if kind == "PaddleJob"] == [job.job_name(0), job.job_name(1)]
    assert job.job_name(1) != job.job_name(0)
    assert [kind for kind, _, _ in cluster.deleted] == ["PaddleJob", "NetworkPolicy"] * 2 and cluster.objects == {}
    assert any("worker-1" in line and "RuntimeError: brpc timeout" in line and "attempt 1 of 3" in line
               for line in echoed)
    assert [c["id"] for c in result.checkpoints] == ["ckpt-1"]


def test_paddlejob_gives_up_after_max_restarts(config, tmp_path, launcher_pod):
    restart_env = []
    cluster = FakeCluster(_paddlejob_controller(99, restart_env))
    with pytest.raises(PsJobError) as failed:
        _launcher(_cfg(config, "cluster.backend=paddlejob", "cluster.max_restarts=1"), tmp_path, cluster, []).run()
    assert restart_env == ["0", "1"]
    assert failed.value.role == "worker-1" and "RuntimeError: brpc timeout" in str(failed.value)
    assert len(cluster.deleted) == 4 and cluster.objects == {}


def test_a_missing_crd_is_a_clear_error_and_leaves_nothing_behind(config, tmp_path, launcher_pod):
    class NoJobSetCrd(FakeCluster):
        def create_namespaced_custom_object(self, *args, **kwargs):
            raise ApiException(status=404, reason="Not Found")

    cluster = NoJobSetCrd(lambda cluster, body: None)
    with pytest.raises(RuntimeError, match=r"cannot create JobSet .*HTTP 404.*is its CRD installed"):
        _launcher(_cfg(config), tmp_path, cluster, []).run()
    assert cluster.objects == {} and cluster.deleted == [("NetworkPolicy", cluster.created[0][1], "Background")]


@pytest.mark.parametrize("data_uri", [None, "/tmp/kfp/dataset", "file:///tmp/kfp/dataset"])
def test_kubernetes_backends_need_a_remote_dataset_uri(config, tmp_path, data_uri):
    with pytest.raises(ValueError, match="remote fsspec URL"):
        step.launch_ps_job(_cfg(config), Path(tmp_path), tmp_path / "logs", echo=print, data_uri=data_uri)


def _wait_for(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = dt.datetime.now() + dt.timedelta(seconds=timeout_s)
    while not condition():
        assert dt.datetime.now() < deadline, "timed out"
        threading.Event().wait(0.005)


def test_clients_come_from_the_pods_service_account_else_the_kubeconfig(monkeypatch):
    from kubernetes import client, config

    loaded = []

    def no_service_account():
        raise config.ConfigException("Service host/port is not set.")

    monkeypatch.setattr(config, "load_incluster_config", no_service_account)
    monkeypatch.setattr(config, "load_kube_config", lambda: loaded.append("kubeconfig"))
    apis = kubernetes_job.KubeApis.from_environment()
    assert loaded == ["kubeconfig"]
    assert (type(apis.custom), type(apis.core), type(apis.networking)) == (
        client.CustomObjectsApi, client.CoreV1Api, client.NetworkingV1Api)


def test_a_job_whose_pods_never_start_fails_with_the_reason_and_is_deleted(config, tmp_path, launcher_pod):
    def controller(cluster, body):
        for role, index in (("ps", 0), ("worker", 0), ("worker", 1)):
            pod = cluster.add_pod(body, role, index)
            pod.phase, pod.reason = "Pending", "ImagePullBackOff"
        cluster.statuses[body["metadata"]["name"]] = dict  # the JobSet reports nothing while pods wait

    cluster = FakeCluster(controller)
    with pytest.raises(PsJobError) as failed:
        _launcher(_cfg(config, "cluster.start_timeout_s=0.2"), tmp_path, cluster, []).run()
    assert "no pod started within 0s (cluster.start_timeout_s): ImagePullBackOff: back-off pulling" in str(failed.value)
    assert cluster.objects == {}


def test_pods_read_a_minio_artifact_through_s3(config, tmp_path, launcher_pod):
    bodies = []
    controller = _succeeding_controller(bodies)
    KubernetesJob(prepare_job(_cfg(config), None), "minio://mlpipeline/v2/artifacts/ctr/prepare-data/dataset", tmp_path / "logs",
                  echo=lambda line: None, apis=FakeCluster(controller).apis(), poll_s=POLL_S).run()
    env = {e["name"]: e.get("value") for e in _pod_templates(bodies[0])["worker"]["spec"]["containers"][0]["env"]}
    assert json.loads(env["PS_JOB_SPEC"])["data_dir"] == "s3://mlpipeline/v2/artifacts/ctr/prepare-data/dataset"
