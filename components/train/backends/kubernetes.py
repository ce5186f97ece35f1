"""Runs a PS job on Kubernetes (``cluster.backend`` trainjob | jobset | paddlejob) from inside the train step's pod.

The step creates the job's objects (:mod:`components.train.backends.manifests`: a NetworkPolicy, then a
TrainingRuntime and its TrainJob, a JobSet or a PaddleJob), streams worker 0's log into its own output and
``logs/worker-0.log`` (progress, epochs and checkpoints are the events the local backend echoes), waits for the
job's outcome and always deletes what it created: after success, after failure, and when the run is cancelled
(Kubeflow sends the step's pod SIGTERM) or interrupted. The objects also carry an ownerReference to the step's
pod, so they are garbage-collected even if the step is killed outright.

Restarts: a JobSet (under a TrainJob too) restarts the whole job itself (``failurePolicy``): up to
``cluster.max_restarts`` times, without counting a restart after the cluster disrupted a pod (preemption,
eviction), and not at all after a role's configuration error. A PaddleJob has no such policy, so the launcher
applies the same rules: a failed one is deleted and created again under a new name. Either way the roles resume
from the latest committed checkpoint (``PS_RESTART_ATTEMPT``).

A TrainJob or JobSet waiting in a Kueue queue (suspended) is not failing to start: ``cluster.start_timeout_s``
counts from its admission.

The step's pod runs as a plain account; the launcher acts as ``cluster.service_account`` through that account's
token, mounted at :data:`~components.train.backends.manifests.LAUNCHER_TOKEN_DIR` into the train step only.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError

from components.checkpoint.restore import restart_target
from components.config import ClusterBackend, is_remote_uri
from components.ps.contract import CONFIG_ERROR_EXIT
from components.train.backends import manifests
from components.train.job import EventLog, JobResult, PreparedJob, PsJobError

TAIL_LINES = 30
POLL_S = 5.0
# Every API call but the log stream gets a deadline, so a hung API server cannot hang the step.
REQUEST_TIMEOUT_S = 30
# Once the job ended, how long worker 0's log may take to be read to its end (its events make the result).
LOG_DRAIN_S = 60.0
# Consecutive failed status polls (API server restarting, network blips) tolerated before the step fails.
STATUS_ERRORS_TOLERATED = 5
PROPAGATION = "Background"  # the pods are deleted with their job
WORKER_0 = "worker-0"
STARTED_PHASES = ("Running", "Succeeded", "Failed")
ENDED_PHASES = ("Succeeded", "Failed")


class JobCancelled(RuntimeError):
    """The step was cancelled (SIGTERM) while its PS job ran; the job's objects were deleted."""


@dataclass
class KubeApis:
    """The API clients the launcher calls (injected in tests)."""

    custom: Any  # CustomObjectsApi: TrainingRuntime, TrainJob, JobSet, PaddleJob
    core: Any  # CoreV1Api: pods and their logs
    networking: Any  # NetworkingV1Api: NetworkPolicy

    @classmethod
    def from_environment(cls, token_dir: str = manifests.LAUNCHER_TOKEN_DIR) -> "KubeApis":
        """Clients acting as the launcher account whose token is mounted at ``token_dir``; without one, as the
        pod's own service account, else as the kubeconfig's user (a developer's machine)."""
        from kubernetes import client, config
        from kubernetes.config.incluster_config import InClusterConfigLoader

        configuration = client.Configuration()
        token = Path(token_dir) / "token"
        try:
            if token.is_file():
                InClusterConfigLoader(token_filename=str(token), cert_filename=str(Path(token_dir) / "ca.crt")
                                      ).load_and_set(configuration)
            else:
                config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)
        api = client.ApiClient(configuration)
        return cls(custom=client.CustomObjectsApi(api), core=client.CoreV1Api(api),
                   networking=client.NetworkingV1Api(api))


# Built-in kinds go through their typed API: (KubeApis field, method suffix). Every other kind is a custom resource.
_BUILTIN_KINDS = {("networking.k8s.io/v1", "NetworkPolicy"): ("networking", "network_policy")}


@dataclass(frozen=True)
class KubeObject:
    api_version: str
    kind: str
    name: str
    namespace: str

    @classmethod
    def of(cls, body: dict) -> "KubeObject":
        return cls(body["apiVersion"], body["kind"], body["metadata"]["name"], body["metadata"]["namespace"])

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"

    @property
    def custom(self) -> bool:
        return (self.api_version, self.kind) not in _BUILTIN_KINDS

    def _custom_resource(self) -> tuple[str, str, str, str]:
        group, version = self.api_version.split("/")
        return group, version, self.namespace, self.kind.lower() + "s"  # the plural of each job kind

    def _typed(self, apis: KubeApis, verb: str) -> Optional[Callable]:
        if self.custom:
            return None
        api, suffix = _BUILTIN_KINDS[(self.api_version, self.kind)]
        return getattr(getattr(apis, api), f"{verb}_namespaced_{suffix}")

    def create(self, apis: KubeApis, body: dict) -> None:
        typed = self._typed(apis, "create")
        if typed:
            typed(self.namespace, body, _request_timeout=REQUEST_TIMEOUT_S)
        else:
            apis.custom.create_namespaced_custom_object(*self._custom_resource(), body,
                                                        _request_timeout=REQUEST_TIMEOUT_S)

    def delete(self, apis: KubeApis) -> None:
        """Delete it and what it owns; an object already gone is fine."""
        typed = self._typed(apis, "delete")
        try:
            if typed:
                typed(self.name, self.namespace, propagation_policy=PROPAGATION, _request_timeout=REQUEST_TIMEOUT_S)
            else:
                apis.custom.delete_namespaced_custom_object(*self._custom_resource(), self.name,
                                                            propagation_policy=PROPAGATION,
                                                            _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as err:
            if err.status != 404:
                raise

    def status(self, apis: KubeApis) -> dict:
        """The ``status`` of a custom resource (the job objects are all custom resources)."""
        body = apis.custom.get_namespaced_custom_object(*self._custom_resource(), self.name,
                                                        _request_timeout=REQUEST_TIMEOUT_S)
        return body.get("status") or {}


@dataclass(frozen=True)
class Outcome:
    succeeded: bool
    detail: str


def _true_condition(status: dict, kind: str) -> Optional[dict]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind and c.get("status") == "True"),
                None)


def _condition_detail(condition: dict) -> str:
    return ": ".join(filter(None, (condition.get("reason"), condition.get("message")))) or condition["type"]


def _conditions_outcome(succeeded: str) -> Callable[[dict], Optional[Outcome]]:
    """The outcome of a kind whose ``succeeded`` or ``Failed`` condition ends it."""
    def outcome(status: dict) -> Optional[Outcome]:
        for kind in (succeeded, "Failed"):
            condition = _true_condition(status, kind)
            if condition:
                return Outcome(kind == succeeded, _condition_detail(condition))
        return None

    return outcome


def _suspended(status: dict) -> bool:
    """Suspended, as Kueue keeps a TrainJob or JobSet until its queue admits it."""
    return _true_condition(status, "Suspended") is not None


def _suspension(status: dict) -> str:
    """A TrainJob's or JobSet's state while suspended, else ''. A TrainJob's status tells no restarts: worker 0's
    log shows them (a new pod that resumes from a checkpoint)."""
    suspended = _true_condition(status, "Suspended")
    return f"suspended, waiting to be admitted ({_condition_detail(suspended)})" if suspended else ""


def _jobset_state(status: dict) -> str:
    restarts, counted = int(status.get("restarts") or 0), int(status.get("restartsCountTowardsMax") or 0)
    if _suspended(status) or not restarts:
        return _suspension(status)
    uncounted = f", {restarts - counted} after a disruption (not counted)" if restarts > counted else ""
    return f"restarted {restarts} time(s){uncounted}; the roles resume from the latest checkpoint"


# paddle-operator's PaddleJobPhase values that end a job.
_PADDLEJOB_SUCCEEDED = ("Completed", "Succeed")
_PADDLEJOB_FAILED = ("Failed", "Aborted", "Terminated")


def _paddlejob_outcome(status: dict) -> Optional[Outcome]:
    phase = status.get("phase")
    if phase in _PADDLEJOB_SUCCEEDED + _PADDLEJOB_FAILED:
        return Outcome(phase in _PADDLEJOB_SUCCEEDED, f"phase {phase}")
    return None


def _paddlejob_state(status: dict) -> str:
    return status.get("phase") or ""


@dataclass(frozen=True)
class _BackendRules:
    outcome: Callable[[dict], Optional[Outcome]]  # None while the job runs
    state: Callable[[dict], str]  # a short status line, echoed when it changes
    queued: Callable[[dict], bool]  # waiting for admission: not failing to start
    relaunch: bool  # the launcher recreates a failed job: the kind restarts nothing itself


_RULES = {
    ClusterBackend.trainjob: _BackendRules(_conditions_outcome("Complete"), _suspension, _suspended, relaunch=False),
    ClusterBackend.jobset: _BackendRules(_conditions_outcome("Completed"), _jobset_state, _suspended, relaunch=False),
    ClusterBackend.paddlejob: _BackendRules(_paddlejob_outcome, _paddlejob_state, lambda status: False, relaunch=True),
}


def _transient(err: Exception) -> bool:
    """A connection problem, a server error or throttling: worth asking again."""
    return not isinstance(err, ApiException) or err.status is None or err.status == 429 or err.status >= 500


def _time_key(stamp: str) -> str:
    """A log line's RFC 3339 timestamp as a string that sorts by time (the kubelet trims trailing zeros)."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return f"{whole}.{fraction.ljust(9, '0')}"


class Worker0Log:
    """Follows worker 0's log in a thread: each line goes to ``path``, events to the :class:`EventLog`,
    other lines to ``echo`` (prefixed). A new worker-0 pod (a restart) is followed when it starts; a cut
    stream is re-attached, skipping the lines it already delivered (by their timestamps)."""

    def __init__(self, apis: KubeApis, namespace: str, events: EventLog, echo: Callable[[str], None],
                 path: Path, poll_s: float):
        self.apis, self.namespace, self.events, self.echo, self.path, self.poll_s = (
            apis, namespace, events, echo, path, poll_s)
        self.selector: Optional[str] = None  # set per job object; a relaunched PaddleJob has a new name
        self._position: dict[str, tuple[str, int]] = {}  # pod uid -> (time key, count) of its last line read
        self._done: set[str] = set()  # pods whose log was read to its end
        self._stop = threading.Event()  # finish the pod being read, then end
        self._aborted = False
        self._response: Any = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="worker-0-log", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self, timeout_s: float) -> bool:
        """Read worker 0's log to its end (its pod has ended); False if that took longer than ``timeout_s``."""
        self._stop.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def abort(self) -> None:
        """Stop reading now (the job failed or is being deleted)."""
        with self._lock:
            self._aborted = True
            response = self._response
        self._stop.set()
        if response is not None:
            response.close()  # unblocks the read in the thread
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _newest_started_pod(self) -> Any:
        if not self.selector:
            return None
        pods = self.apis.core.list_namespaced_pod(self.namespace, label_selector=self.selector,
                                                  _request_timeout=REQUEST_TIMEOUT_S).items
        started = [p for p in pods if p.status and p.status.phase in STARTED_PHASES]
        return max(started, key=lambda p: p.metadata.creation_timestamp, default=None)

    def _run(self) -> None:
        with open(self.path, "w") as log:
            while not self._aborted:
                try:
                    pod = self._newest_started_pod()
                    if pod is not None and pod.metadata.uid not in self._done:
                        self._read(pod, log)
                        if pod.metadata.uid in self._done:
                            continue  # a successor pod may already be running
                    elif self._stop.is_set():
                        return
                except (ApiException, HTTPError, OSError, ValueError) as err:
                    if self._aborted:
                        return
                    self.echo(f"[{WORKER_0}] reading its log failed ({type(err).__name__}: {err}); retrying")
                time.sleep(self.poll_s)

    def _read(self, pod: Any, log) -> None:
        uid, name = pod.metadata.uid, pod.metadata.name
        ended = pod.status.phase in ENDED_PHASES  # then the stream below ends with the pod's last line
        if uid not in self._position:
            self._position[uid] = ("", 0)
            log.write(f"----- pod {name} -----\n")
        response = self.apis.core.read_namespaced_pod_log(
            name, self.namespace, container=pod.spec.containers[0].name, follow=True, timestamps=True,
            _preload_content=False)
        with self._lock:
            if self._aborted:
                response.close()
                return
            self._response = response
        last, count = self._position[uid]  # the last line delivered: its time key, how many lines had it
        to_skip = count  # a re-attached stream starts from the top: skip what was delivered
        try:
            for stamped in iter_resp_lines(response):
                stamp, _, line = stamped.partition(" ")
                key = _time_key(stamp)
                if key < last:
                    continue
                if key == last and to_skip:
                    to_skip -= 1
                    continue
                to_skip = 0
                count, last = (count + 1 if key == last else 1), key  # lines of one write share a timestamp
                self._position[uid] = (last, count)
                log.write(line + "\n")
                log.flush()
                if not self.events.feed(WORKER_0, line):
                    self.echo(f"[{WORKER_0}] {line}")
        finally:
            with self._lock:
                self._response = None
            response.release_conn()
        if ended:
            self._done.add(uid)


class KubernetesJob:
    """One PS job on Kubernetes, from creating its objects to deleting them (see the module doc)."""

    def __init__(self, job: PreparedJob, data_uri: Optional[str], log_dir: Path,
                 echo: Callable[[str], None] = print, apis: Optional[KubeApis] = None, poll_s: float = POLL_S):
        cfg = job.cfg
        if cfg.cluster.backend not in _RULES:
            raise ValueError(f"cluster.backend {cfg.cluster.backend.value!r} does not run on Kubernetes")
        if not is_remote_uri(data_uri):
            raise ValueError(f"cluster.backend={cfg.cluster.backend.value} needs the prepared dataset at a remote "
                             f"fsspec URL the pods can read (s3://...), got {data_uri!r}")
        data_uri = manifests.pod_data_uri(str(data_uri))
        self.job, self.cfg, self.data_uri, self.echo, self.poll_s = job, cfg, data_uri, echo, poll_s
        self.log_dir = Path(log_dir)
        self.rules = _RULES[cfg.cluster.backend]
        self.apis = apis or KubeApis.from_environment()
        self.namespace = os.environ.get("POD_NAMESPACE") or cfg.cluster.namespace
        self.owner = _launcher_pod()
        self.base_name = f"ctr-ps-{uuid.uuid4().hex[:8]}"  # short: <name>-worker-<i>-0 is a 63-char hostname
        self.events = EventLog(echo)
        self.created: list[KubeObject] = []
        self._cancelled = False
        self._cleaning = False
        self._previous_sigterm: Any = None

    def job_name(self, attempt: int) -> str:
        """A relaunched job gets a new name: the old pods may still be terminating under theirs."""
        return self.base_name if attempt == 0 else f"{self.base_name}-r{attempt}"

    def run(self) -> JobResult:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{WORKER_0}.log"
        follower = Worker0Log(self.apis, self.namespace, self.events, self.echo, log_path, self.poll_s)
        started = time.time()
        try:
            self._install_sigterm()
            follower.start()
            self._run_attempts(follower)
            if not follower.finish(LOG_DRAIN_S):
                self.echo(f"warning: worker 0's log was not read to its end within {LOG_DRAIN_S:.0f}s; "
                          "the result may miss its last epochs or checkpoints")
        except KeyboardInterrupt:
            self.echo(f"interrupted: deleting PS job {self.base_name}")
            raise
        finally:
            self._cleaning = True
            follower.abort()
            self._delete_created()
            if self._previous_sigterm is not None:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
        return JobResult(epochs=self.events.epochs, seconds=time.time() - started,
                         checkpoints=self.events.checkpoints, restored_from=self.job.restore, plan=self.job.plan,
                         # worker 0's: the log the launcher follows
                         curve=self.events.curve, day_eval=self.events.day_eval)

    def _run_attempts(self, follower: Worker0Log) -> None:
        """Run the job; a kind that restarts nothing itself is created again after a failure (what JobSet's
        failurePolicy does): up to ``max_restarts`` times, after a disruption without counting, after a
        configuration error not at all."""
        attempts = self.cfg.cluster.max_restarts + 1 if self.rules.relaunch else 1
        counted, launch = 0, 0
        self._announce()
        while True:
            job = self._create(launch)
            follower.selector = manifests.worker0_selector(self.cfg, job.name)
            outcome = self._wait(job)
            if outcome.succeeded:
                self.echo(f"{job} succeeded ({outcome.detail})")
                return
            failed = self._failed_pods(job)
            failure = self._failure(job, outcome, failed)
            disrupted = failed is not None and any(map(_disrupted, failed))
            counted += not disrupted
            if (not self.rules.relaunch or counted == attempts
                    or (failed is not None and any(map(_config_error, failed)))):
                raise failure
            launch += 1
            resume = restart_target(self.job.store, self.job.restore, launch, self.cfg.table.shard_num,
                                    self.job.run_id)
            why = ("was disrupted by the cluster (not counted)" if disrupted
                   else f"failed (attempt {counted} of {attempts})")
            self.echo(f"{failure}\n{job} {why}; creating it again, starting from {resume.id if resume else 'scratch'}")
            self._delete_created()

    def _announce(self) -> None:
        cfg = self.cfg
        self.echo(f"PS job {self.base_name} ({cfg.cluster.backend.value}) in namespace {self.namespace}: "
                  f"{cfg.ps.servers} server(s) + {cfg.ps.workers} worker(s), mode {cfg.ps.mode.value}, "
                  f"data {self.data_uri}")
        for line in self.job.lines():
            self.echo(line)

    def _create(self, attempt: int) -> KubeObject:
        """Create the job's objects in order; returns the job object (the last one)."""
        bodies = manifests.job_manifests(self.job, name=self.job_name(attempt), namespace=self.namespace,
                                         data_uri=self.data_uri, attempt=attempt, owner=self.owner)
        for body in bodies:
            obj = KubeObject.of(body)
            self.created.append(obj)  # before the call: a cancel landing during it must still delete it
            try:
                obj.create(self.apis, body)
            except ApiException as err:
                self.created.remove(obj)  # refused, so not ours (a 409 would name someone else's object)
                raise RuntimeError(f"cannot create {obj} in namespace {self.namespace}: {_api_reason(err, obj)}") from err
            self.echo(f"created {obj}")
        return self.created[-1]

    def _wait(self, job: KubeObject) -> Outcome:
        errors, shown = 0, ""
        since, started = time.time(), False
        while True:
            try:
                status = job.status(self.apis)
                errors = 0
            except (ApiException, HTTPError) as err:
                if isinstance(err, ApiException) and err.status == 404:
                    raise PsJobError(job.name, f"{job} disappeared from namespace {self.namespace} while it ran "
                                               "(deleted by someone else?)") from err
                errors += 1
                if not _transient(err) or errors > STATUS_ERRORS_TOLERATED:
                    raise RuntimeError(f"cannot read the status of {job}: {_api_reason(err, job)}") from err
                status = None
            if status is not None:
                outcome = self.rules.outcome(status)
                if outcome is not None:
                    return outcome
                if self.rules.queued(status):
                    since = time.time()  # waiting for quota is not failing to start
                state = self.rules.state(status)
                if state and state != shown:
                    self.echo(f"{job}: {state}")
                    shown = state
            if not started:
                started = self._check_started(job, since)
            time.sleep(self.poll_s)

    def _check_started(self, job: KubeObject, since: float) -> bool:
        """True once a pod of the job has started; a job none of whose pods start within
        ``cluster.start_timeout_s`` (an image that cannot be pulled, no node with a free GPU) fails with why."""
        try:
            pods = self.apis.core.list_namespaced_pod(self.namespace, label_selector=manifests.job_pods_selector(job.name),
                                                      _request_timeout=REQUEST_TIMEOUT_S).items
        except (ApiException, HTTPError):
            pods = None  # judged again at the next poll
        if pods and any(p.status and p.status.phase in STARTED_PHASES for p in pods):
            return True
        timeout = self.cfg.cluster.start_timeout_s
        if time.time() - since > timeout:
            reasons = sorted({_pending_reason(p) for p in pods or []}) or ["no pod was created"]
            raise PsJobError(job.name, f"PS job {job.name}: no pod started within {timeout:.0f}s "
                                       f"(cluster.start_timeout_s): " + "; ".join(reasons))
        return False

    def _failed_pods(self, job: KubeObject) -> Optional[list]:
        """The job's failed pods, the first to fail first; None when they cannot be listed."""
        try:
            pods = self.apis.core.list_namespaced_pod(self.namespace,
                                                      label_selector=manifests.job_pods_selector(job.name),
                                                      _request_timeout=REQUEST_TIMEOUT_S).items
        except (ApiException, HTTPError) as err:
            self.echo(f"warning: the pods of {job} cannot be listed: {_api_reason(err, None)}")
            return None
        return sorted((p for p in pods if _pod_failure(p)), key=_failed_at)

    def _failure(self, job: KubeObject, outcome: Outcome, failed: Optional[list]) -> PsJobError:
        """The error naming the pod that failed first, quoting the last lines of its log."""
        if failed is None:
            return PsJobError(job.name, f"PS job {job.name}: {job} failed ({outcome.detail}); its pods cannot be "
                                        "listed")
        if not failed:
            return PsJobError(job.name, f"PS job {job.name}: {job} failed ({outcome.detail}); no failed pod is left "
                                        "to name")
        first = failed[0]
        role = self._role_name(first)
        others = ", ".join(self._role_name(p) for p in failed[1:])
        return PsJobError(role, f"PS job {job.name}: {role} (pod {first.metadata.name}) {_pod_failure(first)} "
                                f"[{job}: {outcome.detail}]" + (f"; also failed: {others}" if others else "")
                          + f". Last lines of its log:\n{self._log_tail(first)}")

    def _role_name(self, pod: Any) -> str:
        """``server-1`` / ``worker-0`` from the pod's role label and index; else the pod's name."""
        role = (pod.metadata.labels or {}).get(manifests.ROLE_LABEL)
        index = manifests.pod_index(self.cfg, pod.metadata.name, pod.metadata.labels or {})
        return f"{role}-{index}" if role and index and index.isdigit() else pod.metadata.name

    def _log_tail(self, pod: Any) -> str:
        try:
            text = self.apis.core.read_namespaced_pod_log(pod.metadata.name, self.namespace,
                                                          container=pod.spec.containers[0].name,
                                                          tail_lines=TAIL_LINES, _request_timeout=REQUEST_TIMEOUT_S)
        except (ApiException, HTTPError) as err:
            return f"    (its log cannot be read: {_api_reason(err, None)})"
        return "\n".join(f"    {line}" for line in text.splitlines()[-TAIL_LINES:])

    def _delete_created(self) -> None:
        """Delete what this launcher created, job first; a failure is reported, not raised (the objects'
        ownerReference still removes them with the step's pod)."""
        while self.created:
            obj = self.created.pop()
            try:
                obj.delete(self.apis)
                self.echo(f"deleted {obj}")
            except (ApiException, HTTPError) as err:
                self.echo(f"warning: cannot delete {obj} in namespace {self.namespace}: {_api_reason(err, obj)}")

    def _install_sigterm(self) -> None:
        """Kubeflow cancels a run by sending its pods SIGTERM: delete the job, then fail the step.
        Only the main thread may set handlers; the previous one is kept first, to be restored."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        self._previous_sigterm = previous if previous is not None else signal.SIG_DFL  # None: set outside Python
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        first = not self._cancelled
        self._cancelled = True
        if first and not self._cleaning:  # else the job's objects are being deleted already
            raise JobCancelled(f"PS job {self.base_name} cancelled (SIGTERM): its Kubernetes objects are deleted")


def _launcher_pod() -> Optional[dict]:
    """The step's own pod as an ownerReference (POD_NAME / POD_UID from the downward API), if known."""
    name, uid = os.environ.get("POD_NAME"), os.environ.get("POD_UID")
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid} if name and uid else None


def _api_reason(err: Exception, obj: Optional[KubeObject]) -> str:
    if not isinstance(err, ApiException):
        return f"{type(err).__name__}: {err}"
    reason = f"HTTP {err.status} {err.reason}"
    if err.status == 403:
        return (f"{reason}: the launcher account (cluster.service_account, whose token the train step mounts) lacks "
                "what the run directory's k8s/rbac.yaml grants")
    if err.status == 404 and obj is not None and obj.custom:
        return (f"{reason}: no {obj.kind} API ({obj.api_version}) in the cluster (is its CRD installed?) "
                f"or no namespace {obj.namespace}")
    return reason


def _disruption(pod: Any) -> Optional[Any]:
    """The pod's DisruptionTarget condition: the cluster stopped it (preemption, eviction, node drain)."""
    conditions = (pod.status.conditions or []) if pod.status else []
    return next((c for c in conditions if c.type == "DisruptionTarget" and c.status == "True"), None)


def _disrupted(pod: Any) -> bool:
    return _disruption(pod) is not None


def _config_error(pod: Any) -> bool:
    """A container exited with the PS contract's configuration-error status: no restart can mend it."""
    statuses = (pod.status.container_statuses or []) if pod.status else []
    return any(s.state and s.state.terminated and s.state.terminated.exit_code == CONFIG_ERROR_EXIT for s in statuses)


def _pod_failure(pod: Any) -> Optional[str]:
    """How a pod failed (a container exited non-zero, or the pod failed, e.g. evicted); None if it did not."""
    disruption = _disruption(pod)
    disrupted = (f"; the cluster disrupted it ({': '.join(filter(None, (disruption.reason, disruption.message)))})"
                 if disruption else "")
    for status in (pod.status.container_statuses or []) if pod.status else []:
        terminated = status.state.terminated if status.state else None
        if terminated is not None and terminated.exit_code != 0:
            cause = " (a configuration error: restarting cannot mend it)" if _config_error(pod) else (
                f" ({terminated.reason})" if terminated.reason else "")
            return f"exited with code {terminated.exit_code}{cause}{disrupted}"
    if disruption:
        return disrupted[2:]
    if pod.status and pod.status.phase == "Failed":
        return f"failed: {pod.status.reason or 'unknown reason'}" + (f": {pod.status.message}" if pod.status.message else "")
    return None


def _pending_reason(pod: Any) -> str:
    """Why a pod has not started: a waiting container's reason (ImagePullBackOff, ...) or the scheduler's."""
    status = pod.status
    for container in (status.container_statuses or []) if status else []:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason:
            return f"{waiting.reason}" + (f": {waiting.message}" if waiting.message else "")
    for condition in (status.conditions or []) if status else []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return f"{condition.reason}: {condition.message}" if condition.message else str(condition.reason)
    return f"{(status.phase if status else None) or 'Pending'}"


def _failed_at(pod: Any) -> Any:
    """When a pod's container ended (the first failure is the cause, the rest usually follow from it)."""
    times = [s.state.terminated.finished_at for s in (pod.status.container_statuses or [])
             if s.state and s.state.terminated and s.state.terminated.finished_at]
    return min(times) if times else pod.metadata.creation_timestamp
