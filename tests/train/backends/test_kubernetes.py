"""The Kubernetes launcher's lifecycle against an in-memory Kubernetes API that plays the Trainer / JobSet /
PaddleJob controllers: objects created and always deleted, worker 0's log streamed (across restarts and cut
streams), failures named, cancellation by SIGTERM, restarts (a disruption not counted, a configuration error not
restarted), PaddleJob relaunches, Kueue's suspension. The manifests are the real ones; what the controllers make
of them comes from :mod:`tests.train.backends.kube_controllers`."""

import dataclasses
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import pytest
from kubernetes.client import (V1Container, V1ContainerState, V1ContainerStateRunning, V1ContainerStateTerminated,
                               V1ContainerStateWaiting, V1ContainerStatus, V1ObjectMeta, V1Pod, V1PodCondition,
                               V1PodList, V1PodSpec, V1PodStatus)
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from components.config import ClusterBackend
from components.config_rules import validate
from components.ps.contract import CONFIG_ERROR_EXIT, RESTART_ENV, SPEC_ENV, STORE_REFUSED_EXIT, STORE_REFUSED_PREFIX
from components.train import step
from components.train.backends import manifests
from components.train.backends.kubernetes.api import KubeApis
from components.train.backends.kubernetes.lifecycle import JobCancelled, KubernetesJob
from components.train.job import PsJobError, PsJobStoreError, prepare_job
from tests.conftest import ROOT
from tests.train.backends.kube_controllers import (job_failure, job_pod, jobset_action, jobset_after_failure,
                                                   pod_templates, replicated_jobs, running_jobset)

NAMESPACE = "team-a"
DATA_URI = "s3://ctr/kfp/prepare/dataset"
BASELINE_URI = "s3://ctr/kfp/fit-baseline/baseline"  # the pipeline's fit-baseline step's: the model blends it in


def _prepared(cfg):
    """The job as the train step prepares it: with the fitted baseline's URL (model.blend_baseline)."""
    return dataclasses.replace(prepare_job(cfg, None), baseline=BASELINE_URI)
POLL_S = 0.01
JOBSET_FAILED = {"conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs",
                                 "message": "jobset failed: reached max restarts"}]}
# The backends whose job is a JobSet: the launcher's own, or the one Kubeflow Trainer makes of a TrainJob.
JOBSET_BACKENDS = ["jobset", "trainjob"]
JOB_KINDS = {"jobset": "JobSet", "trainjob": "TrainJob", "paddlejob": "PaddleJob"}


def _completed(body: dict) -> dict:
    """A finished job's status: JobSet's Completed condition, which Trainer copies to its TrainJob as Complete;
    a PaddleJob's phase."""
    if body["kind"] == "PaddleJob":
        return {"phase": "Completed"}
    kind = "Complete" if body["kind"] == "TrainJob" else "Completed"
    return {"conditions": [{"type": kind, "status": "True", "reason": "AllJobsCompleted"}]}


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
        self.disruption: Optional[str] = None  # the reason of its DisruptionTarget condition
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

    def disrupt(self, reason: str = "PreemptionByScheduler") -> "FakePod":
        """What preemption does: the DisruptionTarget condition, then SIGTERM ends the container."""
        self.disruption = reason
        return self.end(143, "Error")

    def model(self) -> V1Pod:
        conditions = [V1PodCondition(type="DisruptionTarget", status="True", reason=self.disruption,
                                     message="Preempted in order to admit critical pod")] if self.disruption else None
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
                     status=V1PodStatus(phase=self.phase, container_statuses=[status], conditions=conditions))


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
        self.jobset_status: dict[str, dict] = {}  # what fail_pod made of each JobSet's failures
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

    def jobset(self, body: dict) -> Optional[dict]:
        return running_jobset(body, self._runtime(body))

    def pod_templates(self, body: dict) -> dict[str, dict]:
        return pod_templates(body, self._runtime(body))

    def _runtime(self, body: dict) -> Optional[dict]:
        ref = body["spec"].get("runtimeRef")
        return self.objects[("trainingruntimes", ref["name"])] if ref else None

    def add_pod(self, body: dict, role: str, index: int) -> FakePod:
        """A pod of ``role`` (ps | worker) as the controllers name and label it."""
        pod = FakePod(self, *job_pod(body, role, index, self._runtime(body)))
        self.pods.append(pod)
        return pod

    def fail_pod(self, body: dict, pod: FakePod, exit_code: int) -> str:
        """``pod`` ends with ``exit_code`` (and its disruption, if any): its Job fails as the Job controller fails it,
        JobSet applies its failurePolicy, and the job object's status shows the result. Returns the action."""
        pod.end(exit_code, "Error")
        jobset = self.jobset(body)
        rjob_name = pod.labels["jobset.sigs.k8s.io/replicatedjob-name"]
        reason, message = job_failure(replicated_jobs(jobset)[rjob_name]["template"]["spec"], NAMESPACE, pod.name,
                                      pod.container, exit_code, ("DisruptionTarget",) if pod.disruption else ())
        action, _ = jobset_action(jobset["spec"]["failurePolicy"], rjob_name, reason, message)
        name = body["metadata"]["name"]
        status = jobset_after_failure(self.jobset_status.get(name, {}), jobset["spec"]["failurePolicy"], action,
                                      failed_job=f"{name}-{rjob_name}-0")
        self.jobset_status[name] = status
        # A TrainJob shows the JobSet's end (Trainer copies its Failed condition), not its restarts.
        shown = {k: v for k, v in status.items() if k == "conditions"} if body["kind"] == "TrainJob" else status
        self.statuses[name] = lambda: shown
        return action

    # CustomObjectsApi
    def create_namespaced_custom_object(self, group, version, namespace, plural, body, **_):
        assert (f"{group}/{version}", namespace, plural) == (body["apiVersion"], NAMESPACE, body["kind"].lower() + "s")
        stored = self._store(body)
        if body["kind"] != "TrainingRuntime":  # a runtime is a template: its TrainJob starts the pods
            self.on_create(self, body)
        return stored

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
        if self.get_hook:
            self.get_hook()
        if (plural, name) not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return {**self.objects[(plural, name)], "status": self.statuses.get(name, dict)()}

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, propagation_policy=None, **_):
        uid = self._delete(plural, name, propagation_policy)["metadata"]["uid"]
        for key, owned in list(self.objects.items()):  # the garbage collector removes what the job owns
            if any(ref["uid"] == uid for ref in owned["metadata"].get("ownerReferences", [])):
                self.objects.pop(key)
        for pod in self.pods:  # the garbage collector removes the job's pods
            if pod.labels.get(manifests.JOB_LABEL) == name:
                with pod.cond:
                    pod.gone = True
                    pod.cond.notify_all()

    # NetworkingV1Api
    def create_namespaced_network_policy(self, namespace, body, **_):
        assert namespace == NAMESPACE
        return _typed(self._store(body))

    def delete_namespaced_network_policy(self, name, namespace, propagation_policy=None, **_):
        self._delete("networkpolicies", name, propagation_policy)

    # CoreV1Api
    def create_namespaced_secret(self, namespace, body, **_):
        assert namespace == NAMESPACE
        return _typed(self._store(body))

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

    def _store(self, body: dict) -> dict:
        """Keep ``body`` as the API server would (with a ``uid``); returns what the server answers."""
        plural = "networkpolicies" if body["kind"] == "NetworkPolicy" else body["kind"].lower() + "s"
        stored = {**body, "metadata": {**body["metadata"], "uid": str(uuid.uuid4())}}
        self.objects[(plural, body["metadata"]["name"])] = stored
        self.created.append((body["kind"], body["metadata"]["name"]))
        return stored

    def _delete(self, plural: str, name: str, propagation: Optional[str]) -> dict:
        body = self.objects.pop((plural, name), None)
        if body is None:
            raise ApiException(status=404, reason="Not Found")
        self.deleted.append((body["kind"], name, propagation))
        return body


def launcher_owned(cluster: FakeCluster) -> list[tuple[str, str]]:
    """What the launcher created and must delete: all but the job's Secrets, which the job owns."""
    return [(kind, name) for kind, name in cluster.created if kind != "Secret"]


def _typed(stored: dict) -> SimpleNamespace:
    """A typed API's answer (a model object), as far as the launcher reads it."""
    return SimpleNamespace(metadata=SimpleNamespace(uid=stored["metadata"]["uid"]))


def _succeeding_controller(bodies: list[dict]) -> Callable[[FakeCluster, dict], None]:
    """A controller whose job succeeds at once (worker 0 exits 0); it keeps the bodies it was given."""

    def controller(cluster, body):
        bodies.append(body)
        cluster.add_pod(body, "worker", 0).end(0)
        cluster.statuses[body["metadata"]["name"]] = lambda: _completed(body)

    return controller


def _launcher(cfg, tmp_path, cluster: FakeCluster, echoed: list[str]) -> KubernetesJob:
    return KubernetesJob(_prepared(cfg), DATA_URI, tmp_path / "logs", echo=echoed.append, apis=cluster.apis(),
                         poll_s=POLL_S)


def _log_lines(tmp_path) -> list[str]:
    return (tmp_path / "logs" / "worker-0.log").read_text().splitlines()


@pytest.fixture
def launcher_pod(monkeypatch):
    """The step's pod as the downward API describes it."""
    monkeypatch.setenv("POD_NAME", "ctr-run-train-x7k2p")
    monkeypatch.setenv("POD_UID", "1b2c3d4e-0000-1111-2222-333344445555")
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_success_streams_worker0_returns_its_events_and_deletes_the_objects(config, tmp_path, launcher_pod, backend):
    cfg = _cfg(config, f"cluster.backend={backend}")
    progress = _event("@progress", role="worker", index=0, epoch=1, examples=500, examples_per_s=250.0,
                      loss=0.5, auc=0.68)

    def controller(cluster, body):
        worker0 = cluster.add_pod(body, "worker", 0)
        worker0.log(progress, "I1129 fleet init done", _epoch(1), _checkpoint(1), _event("@done")).end(0)
        cluster.add_pod(body, "worker", 1).log(_epoch(1)).end(0)  # only worker 0's log is followed
        cluster.add_pod(body, "ps", 0).end(0)
        cluster.statuses[body["metadata"]["name"]] = lambda: _completed(body)  # before worker 0's log is read

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
    kinds = ["TrainingRuntime", "TrainJob"] if backend == "trainjob" else ["JobSet"]
    secrets = [("Secret", f"{name}-tls-server"), ("Secret", f"{name}-tls-worker")]  # ps.tls=auto: on
    assert cluster.created == [("NetworkPolicy", f"{name}-ps")] + [(kind, name) for kind in kinds] + secrets
    # The launcher deletes what it owns; the job's Secrets go with the job (the garbage collector).
    assert cluster.deleted == ([(kind, name, "Background") for kind in reversed(kinds)]
                               + [("NetworkPolicy", f"{name}-ps", "Background")])
    assert cluster.objects == {}
    assert len(f"{name}-worker-{cfg.ps.workers - 1}-0") <= 63  # worker pods' hostnames


@pytest.mark.parametrize("backend", JOB_KINDS)
def test_objects_are_owned_by_the_launcher_pod(config, tmp_path, launcher_pod, backend):
    cluster = FakeCluster(_succeeding_controller([]))
    job = _launcher(_cfg(config, f"cluster.backend={backend}"), tmp_path, cluster, [])
    owned = []
    original_create = cluster._store
    cluster._store = lambda body: owned.append(original_create(body)) or owned[-1]  # as stored: with its uid
    job.run()
    secrets = [body for body in owned if body["kind"] == "Secret"]
    launched = [body for body in owned if body["kind"] != "Secret"]
    assert launched[-1]["kind"] == JOB_KINDS[backend]
    for body in launched:
        assert body["metadata"]["namespace"] == NAMESPACE
        (owner,) = body["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "ctr-run-train-x7k2p",
                                                                "1b2c3d4e-0000-1111-2222-333344445555")
    # The job's TLS Secrets (none for a PaddleJob, whose pods carry no terminator) are the job object's.
    assert len(secrets) == (0 if backend == "paddlejob" else 2)
    for body in secrets:
        (owner,) = body["metadata"]["ownerReferences"]
        job_object = launched[-1]["metadata"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (JOB_KINDS[backend], job_object["name"],
                                                                job_object["uid"])


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_worker_failure_names_the_pod_that_failed_first_and_quotes_its_log(config, tmp_path, launcher_pod, backend):
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
        _launcher(_cfg(config, f"cluster.backend={backend}"), tmp_path, cluster, echoed).run()
    assert failed.value.role == "worker-1"
    message = str(failed.value)
    assert "worker-1 (pod " in message and "exited with code 1 (Error)" in message
    assert "reached max restarts" in message and "also failed: worker-0" in message
    assert "    MemoryError: out of memory" in message and "    Traceback (most recent call last):" in message
    assert cluster.objects == {} and len(cluster.deleted) == len(launcher_owned(cluster))


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_sigterm_deletes_the_job_raises_cancelled_and_restores_the_handler(config, tmp_path, launcher_pod, backend):
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
            _launcher(_cfg(config, f"cluster.backend={backend}"), tmp_path, cluster, []).run()
        sender.join()
        assert signal.getsignal(signal.SIGTERM) is previous_handler
    finally:
        signal.signal(signal.SIGTERM, original)
    assert cluster.objects == {} and ({kind for kind, _, _ in cluster.deleted}
                                      == {kind for kind, _ in launcher_owned(cluster)})
    assert JOB_KINDS[backend] in {kind for kind, _, _ in cluster.deleted}
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
            cluster.statuses[name] = lambda: _completed(body)

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


def _restart_controller(fail: Callable[[FakeCluster, dict, FakePod], None]):
    """A JobSet (or TrainJob) whose worker 0 commits ckpt-1 and then ``fail(cluster, body, worker1)`` ends its
    first attempt; unless that failed the job, JobSet recreates the pods and worker 0 finishes from ckpt-1."""

    def controller(cluster, body):
        name = body["metadata"]["name"]
        attempt1 = cluster.add_pod(body, "worker", 0).log(_epoch(1), _checkpoint(1))
        worker1 = cluster.add_pod(body, "worker", 1)
        cluster.statuses[name] = dict

        def restart():
            fail(cluster, body, worker1)
            if "conditions" in cluster.jobset_status[name]:  # the job failed: no second attempt
                return
            attempt1.end(143, "Error")  # JobSet deletes the first attempt's pods
            attempt2 = cluster.add_pod(body, "worker", 0).log("resuming from ckpt-1", _epoch(2), _checkpoint(2)).end(0)
            restarted = dict(cluster.jobset_status[name]) if body["kind"] == "JobSet" else {}
            polls = []

            def after_restart():  # complete once the new worker 0's log is followed
                polls.append(1)
                return {**restarted, **(_completed(body) if len(polls) > 1 and attempt2.follows else {})}

            cluster.statuses[name] = after_restart

        attempt1.on_read_to_end = restart

    return controller


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_a_restart_follows_the_new_worker0_pod(config, tmp_path, launcher_pod, backend):
    def worker_fails(cluster, body, worker1):
        assert cluster.fail_pod(body, worker1, 1) == "RestartJobSet"

    cluster, echoed = FakeCluster(_restart_controller(worker_fails)), []
    job = _launcher(_cfg(config, f"cluster.backend={backend}", "cluster.max_restarts=1"), tmp_path, cluster, echoed)
    result = job.run()
    assert [e["epoch"] for e in result.epochs] == [1, 2]
    assert [c["id"] for c in result.checkpoints] == ["ckpt-1", "ckpt-2"]
    headers = [line for line in _log_lines(tmp_path) if line.startswith("----- pod")]
    worker0_pods = [p.name for p in cluster.pods if p.labels[manifests.ROLE_LABEL] == "worker" and
                    manifests.pod_index(job.cfg, p.name, p.labels) == "0"]
    assert headers == [f"----- pod {name} -----" for name in worker0_pods] and len(worker0_pods) == 2
    if backend == "jobset":  # a TrainJob's status shows no restarts
        assert f"JobSet {job.job_name(0)}: restarted 1 time(s); the roles resume from the latest checkpoint" in echoed


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_a_preempted_pod_restarts_the_job_without_using_up_max_restarts(config, tmp_path, launcher_pod, backend):
    def preempted(cluster, body, worker1):
        worker1.disruption = "PreemptionByScheduler"
        assert cluster.fail_pod(body, worker1, 143) == "RestartJobSetAndIgnoreMaxRestarts"

    cluster, echoed = FakeCluster(_restart_controller(preempted)), []
    job = _launcher(_cfg(config, f"cluster.backend={backend}", "cluster.max_restarts=0"), tmp_path, cluster, echoed)
    result = job.run()
    assert [c["id"] for c in result.checkpoints] == ["ckpt-1", "ckpt-2"]
    assert cluster.jobset_status[job.job_name(0)] == {"restarts": 1, "restartsCountTowardsMax": 0}
    if backend == "jobset":
        assert (f"JobSet {job.job_name(0)}: restarted 1 time(s), 1 after a disruption (not counted); the roles "
                "resume from the latest checkpoint") in echoed


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_a_failure_that_is_not_a_preemption_uses_up_max_restarts(config, tmp_path, launcher_pod, backend):
    cluster = FakeCluster(_restart_controller(lambda cluster, body, worker1: cluster.fail_pod(body, worker1, 1)))
    with pytest.raises(PsJobError) as failed:
        _launcher(_cfg(config, f"cluster.backend={backend}", "cluster.max_restarts=0"), tmp_path, cluster, []).run()
    assert failed.value.role == "worker-1" and "ReachedMaxRestarts" in str(failed.value)
    assert "exited with code 1 (Error)" in str(failed.value)


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_a_configuration_error_fails_the_job_at_once_with_its_reason(config, tmp_path, launcher_pod, backend):
    def config_error(cluster, body, worker1):
        worker1.log("configuration error: config key 'ps.workers' has value 0; allowed: a number > 0")
        assert cluster.fail_pod(body, worker1, CONFIG_ERROR_EXIT) == "FailJobSet"

    cluster = FakeCluster(_restart_controller(config_error))
    with pytest.raises(PsJobError) as failed:
        _launcher(_cfg(config, f"cluster.backend={backend}", "cluster.max_restarts=2"), tmp_path, cluster, []).run()
    message = str(failed.value)
    assert failed.value.role == "worker-1"
    assert f"exited with code {CONFIG_ERROR_EXIT} (a configuration error: restarting cannot mend it)" in message
    assert "FailJobSetAction" in message and "config key 'ps.workers' has value 0" in message
    assert len([p for p in cluster.pods if p.labels[manifests.ROLE_LABEL] == "worker"]) == 2  # never restarted
    assert cluster.objects == {}



@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_a_store_that_refused_a_role_fails_the_job_at_once_in_one_line(config, tmp_path, launcher_pod, backend):
    """A full disk under the store: restarting would hit the same wall, so the Job's podFailurePolicy and JobSet's
    failurePolicy fail the job at once, and the step says the store's own reason in one line (exit 2)."""
    refusal = f"{STORE_REFUSED_PREFIX}writing /ckpt/_upload/w1.npz: [Errno 28] No space left on device"

    def store_refused(cluster, body, worker1):
        worker1.log("training pass 1")
        worker1.log(refusal)
        assert cluster.fail_pod(body, worker1, STORE_REFUSED_EXIT) == "FailJobSet"

    cluster = FakeCluster(_restart_controller(store_refused))
    with pytest.raises(PsJobStoreError) as failed:
        _launcher(_cfg(config, f"cluster.backend={backend}", "cluster.max_restarts=2"), tmp_path, cluster, []).run()
    message = str(failed.value)
    assert failed.value.role == "worker-1" and "\n" not in message
    assert refusal in message and "kubectl logs" in message
    assert len([p for p in cluster.pods if p.labels[manifests.ROLE_LABEL] == "worker"]) == 2  # never restarted
    assert cluster.objects == {}

def test_kueue_suspension_does_not_count_as_failing_to_start(config, tmp_path, launcher_pod):
    queued_polls = []

    def controller(cluster, body):
        name = body["metadata"]["name"]

        def status():  # Kueue holds the TrainJob suspended for a while, then admits it
            queued_polls.append(1)
            if len(queued_polls) < 40:
                return {"conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended",
                                        "message": "Workload is waiting for quota in LocalQueue team-a-queue"}]}
            cluster.add_pod(body, "worker", 0).end(0)
            cluster.statuses[name] = lambda: _completed(body)
            return {}

        cluster.statuses[name] = status

    cluster, echoed = FakeCluster(controller), []
    job = _launcher(_cfg(config, "cluster.backend=trainjob", "cluster.queue_name=team-a-queue",
                         "cluster.start_timeout_s=0.1"), tmp_path, cluster, echoed)
    job.run()  # 40 polls of 10 ms exceed the start timeout: only the time since admission counts
    assert len(queued_polls) >= 40
    assert (f"TrainJob {job.job_name(0)}: suspended, waiting to be admitted (Suspended: Workload is waiting for "
            "quota in LocalQueue team-a-queue)") in echoed


def _paddlejob_controller(fail_attempts: int, restores: list[Optional[dict]],
                          fail: Callable[[FakePod], object] = lambda pod: pod.end(1, "Error")):
    """A PaddleJob whose first ``fail_attempts`` attempts fail in worker 1 (``fail`` ends it); records what each
    attempt's spec restores (its pods have no restart attempt to choose from themselves)."""

    def controller(cluster, body):
        name = body["metadata"]["name"]
        env = {e["name"]: e.get("value") for e in cluster.pod_templates(body)["worker"]["spec"]["containers"][0]["env"]}
        assert RESTART_ENV not in env
        restores.append(json.loads(env[SPEC_ENV])["restore"])
        if len(restores) <= fail_attempts:
            fail(cluster.add_pod(body, "worker", 1).log("connecting to servers", "RuntimeError: brpc timeout"))
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
    assert restart_env == [None, None]  # no checkpoint committed: both attempts start from scratch
    assert [name for kind, name in cluster.created if kind == "PaddleJob"] == [job.job_name(0), job.job_name(1)]
    assert job.job_name(1) != job.job_name(0)
    assert [kind for kind, _, _ in cluster.deleted] == ["PaddleJob", "NetworkPolicy"] * 2 and cluster.objects == {}
    assert any("worker-1" in line and "RuntimeError: brpc timeout" in line for line in echoed)
    assert (f"restart 1 of 2: PS job {job.base_name}: worker-1 exited with code 1 (Error); attempt 2 of 3 starting "
            "from scratch again; at least 0 examples to train again (0s of training lost)") in echoed
    assert [(r.attempt, r.role) for r in job.restarts] == [(1, "worker-1")]
    assert [c["id"] for c in result.checkpoints] == ["ckpt-1"]


def test_paddlejob_gives_up_after_max_restarts(config, tmp_path, launcher_pod):
    restart_env = []
    cluster = FakeCluster(_paddlejob_controller(99, restart_env))
    with pytest.raises(PsJobError) as failed:
        _launcher(_cfg(config, "cluster.backend=paddlejob", "cluster.max_restarts=1"), tmp_path, cluster, []).run()
    assert restart_env == [None, None]
    assert failed.value.role == "worker-1" and "RuntimeError: brpc timeout" in str(failed.value)
    assert len(cluster.deleted) == 4 and cluster.objects == {}


def test_a_preempted_paddlejob_is_recreated_without_using_up_max_restarts(config, tmp_path, launcher_pod):
    restart_env = []
    cluster, echoed = FakeCluster(_paddlejob_controller(2, restart_env, fail=FakePod.disrupt)), []
    job = _launcher(_cfg(config, "cluster.backend=paddlejob", "cluster.max_restarts=0"), tmp_path, cluster, echoed)
    result = job.run()
    assert restart_env == [None] * 3 and [c["id"] for c in result.checkpoints] == ["ckpt-1"]
    disrupted = [line for line in echoed if "was disrupted by the cluster (not counted)" in line]
    assert len(disrupted) == 2 and "the cluster disrupted it (PreemptionByScheduler" in disrupted[0]
    assert cluster.objects == {}


def test_a_paddlejob_configuration_error_is_not_recreated(config, tmp_path, launcher_pod):
    restart_env = []
    cluster = FakeCluster(_paddlejob_controller(1, restart_env, fail=lambda pod: pod.end(CONFIG_ERROR_EXIT, "Error")))
    with pytest.raises(PsJobError, match="a configuration error: restarting cannot mend it"):
        _launcher(_cfg(config, "cluster.backend=paddlejob", "cluster.max_restarts=2"), tmp_path, cluster, []).run()
    assert restart_env == [None] and cluster.objects == {}


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_a_missing_crd_is_a_clear_error_and_leaves_nothing_behind(config, tmp_path, launcher_pod, backend):
    class NoJobSetCrd(FakeCluster):
        def create_namespaced_custom_object(self, *args, **kwargs):
            raise ApiException(status=404, reason="Not Found")

    cluster = NoJobSetCrd(lambda cluster, body: None)
    first = "TrainingRuntime" if backend == "trainjob" else "JobSet"
    with pytest.raises(RuntimeError, match=rf"cannot create {first} .*HTTP 404.*is its CRD installed"):
        _launcher(_cfg(config, f"cluster.backend={backend}"), tmp_path, cluster, []).run()
    assert cluster.objects == {} and cluster.deleted == [("NetworkPolicy", cluster.created[0][1], "Background")]


@pytest.mark.parametrize("data_uri", [None, "/tmp/kfp/dataset", "file:///tmp/kfp/dataset"])
def test_kubernetes_backends_need_a_remote_dataset_uri(config, tmp_path, data_uri):
    with pytest.raises(ValueError, match="remote fsspec URL"):
        step.launch_ps_job(_cfg(config), Path(tmp_path), tmp_path / "logs", echo=print, data_uri=data_uri)


def test_every_cluster_backend_has_a_class_and_the_local_one_needs_no_kubernetes_client():
    assert set(step.BACKENDS) == set(ClusterBackend)
    assert step.BACKENDS[ClusterBackend.jobset]() is KubernetesJob
    probe = ("import sys; from components.config import ClusterBackend; from components.train.step import BACKENDS; "
             "print(BACKENDS[ClusterBackend.local]().__name__, 'kubernetes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["LocalJob", "False"]


def _wait_for(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = dt.datetime.now() + dt.timedelta(seconds=timeout_s)
    while not condition():
        assert dt.datetime.now() < deadline, "timed out"
        threading.Event().wait(0.005)


def test_clients_act_as_the_launcher_account_through_short_lived_tokens_else_the_pods_account_else_the_kubeconfig(
        monkeypatch):
    import datetime

    from kubernetes import client, config

    from components.train.backends.kubernetes import api

    loaded = []

    def no_service_account(client_configuration=None):
        raise config.ConfigException("Service host/port is not set.")

    monkeypatch.setattr(config, "load_incluster_config", no_service_account)
    monkeypatch.setattr(config, "load_kube_config", lambda client_configuration=None: loaded.append("kubeconfig"))
    apis = KubeApis.from_environment()
    assert loaded == ["kubeconfig"]
    assert (type(apis.custom), type(apis.core), type(apis.networking)) == (
        client.CustomObjectsApi, client.CoreV1Api, client.NetworkingV1Api)

    # In a step: the pod's own account (its projected token) requests tokens of the launcher account, bound to the
    # pod, each living an hour; every client sends the current one, renewed before it expires.
    def in_cluster(client_configuration=None):
        client_configuration.host = "https://10.96.0.1:443"
        client_configuration.api_key = {"authorization": "bearer pods-own-token"}

    now, requests = [1_000_000.0], []

    def token_request(self, name, namespace, body, **kwargs):
        sent = self.api_client.configuration.api_key["authorization"]
        requests.append((name, namespace, body.spec.expiration_seconds, body.spec.bound_object_ref.uid, sent))
        expiry = datetime.datetime.fromtimestamp(now[0] + body.spec.expiration_seconds, datetime.timezone.utc)
        status = client.V1TokenRequestStatus(token=f"launcher-token-{len(requests)}", expiration_timestamp=expiry)
        return client.AuthenticationV1TokenRequest(spec=body.spec, status=status)

    monkeypatch.setattr(config, "load_incluster_config", in_cluster)
    monkeypatch.setattr(client.CoreV1Api, "create_namespaced_service_account_token", token_request)
    monkeypatch.setattr(api.time, "time", lambda: now[0])
    monkeypatch.setenv(manifests.LAUNCHER_ACCOUNT_ENV, "ctr-ps-launcher")
    monkeypatch.setenv("POD_NAMESPACE", "team-a")
    monkeypatch.setenv("POD_NAME", "run-train-abc")
    monkeypatch.setenv("POD_UID", "uid-1")
    apis = KubeApis.from_environment()
    assert requests == [("ctr-ps-launcher", "team-a", 3600, "uid-1", "bearer pods-own-token")]

    def sent():
        return {api.api_client.configuration.get_api_key_with_prefix("authorization")
                for api in (apis.custom, apis.core, apis.networking)}

    assert sent() == {"Bearer launcher-token-1"}
    now[0] += 3600 - 301  # still five minutes to go: the same token
    assert sent() == {"Bearer launcher-token-1"} and len(requests) == 1
    now[0] += 2  # then a new one
    assert sent() == {"Bearer launcher-token-2"} and len(requests) == 2

    # Refused (no k8s/rbac.yaml applied): one line naming the account and what to apply.
    def refused(self, name, namespace, body, **kwargs):
        raise client.ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(client.CoreV1Api, "create_namespaced_service_account_token", refused)
    with pytest.raises(PermissionError, match="cannot get a token of the launcher account ctr-ps-launcher in "
                                              "namespace team-a: .*k8s/rbac.yaml"):
        KubeApis.from_environment()


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_a_job_whose_pods_never_start_fails_with_the_reason_and_is_deleted(config, tmp_path, launcher_pod, backend):
    def controller(cluster, body):
        for role, index in (("ps", 0), ("worker", 0), ("worker", 1)):
            pod = cluster.add_pod(body, role, index)
            pod.phase, pod.reason = "Pending", "ImagePullBackOff"
        cluster.statuses[body["metadata"]["name"]] = dict  # the JobSet reports nothing while pods wait

    cluster = FakeCluster(controller)
    with pytest.raises(PsJobError) as failed:
        cfg = _cfg(config, f"cluster.backend={backend}", "cluster.start_timeout_s=0.2")
        _launcher(cfg, tmp_path, cluster, []).run()
    assert "no pod started within 0s (cluster.start_timeout_s): ImagePullBackOff: back-off pulling" in str(failed.value)
    assert cluster.objects == {}


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_pods_read_a_minio_artifact_through_s3(config, tmp_path, launcher_pod, backend):
    bodies, workers = [], []
    succeed = _succeeding_controller(bodies)

    def controller(cluster, body):
        workers.append(cluster.pod_templates(body)["worker"])
        succeed(cluster, body)

    KubernetesJob(_prepared(_cfg(config, f"cluster.backend={backend}")),
                  "minio://mlpipeline/v2/artifacts/ctr/prepare-data/dataset", tmp_path / "logs",
                  echo=lambda line: None, apis=FakeCluster(controller).apis(), poll_s=POLL_S).run()
    env = {e["name"]: e.get("value") for e in workers[0]["spec"]["containers"][0]["env"]}
    assert json.loads(env["PS_JOB_SPEC"])["data_dir"] == "s3://mlpipeline/v2/artifacts/ctr/prepare-data/dataset"
    assert json.loads(env["PS_JOB_SPEC"])["baseline"] == BASELINE_URI  # what the workers blend in
