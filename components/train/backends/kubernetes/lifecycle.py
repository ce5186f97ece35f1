"""One PS job on Kubernetes from the train step's pod: its objects created, worker 0's and the servers' logs
followed, its roles' heartbeat records in the store judged (:mod:`components.train.liveness`), its outcome awaited
(the job recreated after a hung role, a PaddleJob after a failure too), and what it created always deleted (see the
package doc)."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from components.checkpoint.lease import StoreLease
from components.checkpoint.restore import restart_target
from components.config_rules import is_remote_uri
from components.ps.contract import Role
from components.ps.tls import tls_on
from components.train.backends import manifests, pod_tls
from components.train.backends.base import JobBackend, StepInputs
from components.train.backends.kubernetes.api import KubeApis, KubeObject, api_reason, launcher_namespace, transient
from components.train.backends.kubernetes.diagnosis import PodDiagnosis, disrupted
from components.train.backends.kubernetes.pod_log import WORKER_0, PodLog
from components.train.backends.kubernetes.status import STATUS_RULES, Outcome
from components.train.job import PreparedJob, PsJobError, RoleFailed, check_lease
from components.train.liveness import Liveness, role_names, stall_what
from components.train.restarts import Attempt, Restart, position

POLL_S = 5.0
# Once the job ended, how long worker 0's log may take to be read to its end (its events make the result), and then
# the servers' (they may still be shutting down: what they logged by then is enough).
LOG_DRAIN_S, SERVER_LOG_DRAIN_S = 60.0, 5.0
# Consecutive failed status polls (API server restarting, network blips) tolerated before the step fails.
STATUS_ERRORS_TOLERATED = 5


class JobCancelled(RuntimeError):
    """The step was cancelled (SIGTERM) while its PS job ran; the job's objects were deleted."""


class CancelOnSigterm:
    """Kubeflow cancels a run by sending its pods SIGTERM: while entered, the first one raises
    :class:`JobCancelled` (the launcher then deletes the job), unless the deletion has begun (:meth:`hold`).
    Only the main thread may set handlers; the previous one is restored on exit."""

    def __init__(self, job_name: str):
        self.job_name = job_name
        self._previous: Any = None
        self._held = False
        self._cancelled = False

    def __enter__(self) -> "CancelOnSigterm":
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGTERM)
            self._previous = previous if previous is not None else signal.SIG_DFL  # None: set outside Python
            signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def hold(self) -> None:
        self._held = True

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        first = not self._cancelled
        self._cancelled = True
        if first and not self._held:  # else the job's objects are being deleted already
            raise JobCancelled(f"PS job {self.job_name} cancelled (SIGTERM): its Kubernetes objects are deleted")

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


class KubernetesJob(JobBackend):
    """One PS job on Kubernetes, from creating its objects to deleting them (see the package doc)."""

    def __init__(self, job: PreparedJob, data_uri: Optional[str], log_dir: Path,
                 echo: Callable[[str], None] = print, apis: Optional[KubeApis] = None, poll_s: float = POLL_S,
                 lease: Optional[StoreLease] = None):
        backend = job.cfg.cluster.backend
        if backend not in STATUS_RULES:
            raise ValueError(f"cluster.backend {backend.value!r} does not run on Kubernetes")
        if not is_remote_uri(data_uri):
            raise ValueError(f"cluster.backend={backend.value} needs the prepared dataset at a remote "
                             f"fsspec URL the pods can read (s3://...), got {data_uri!r}")
        if job.cfg.model.blend_baseline and not job.baseline:
            raise ValueError(f"cluster.backend={backend.value} with model.blend_baseline needs the fitted baseline at "
                             "a remote fsspec URL the pods can read (the pipeline's fit-baseline step), or "
                             "model.blend_baseline=false")
        super().__init__(job, log_dir, echo)
        self.data_uri, self.poll_s = manifests.pod_data_uri(str(data_uri)), poll_s
        # The checkpoint store's lease the step holds: lost, the job is deleted, or a later run that took the store
        # over could prune the checkpoint this one is writing.
        self.lease = lease
        self.rules = STATUS_RULES[backend]
        self.apis = apis or KubeApis.from_environment()
        self.namespace = launcher_namespace(self.cfg.cluster)
        self.owner = _launcher_pod()
        self.pipeline_run = os.environ.get(manifests.PIPELINE_RUN_ENV) or None  # empty: the pod has no run label
        # After the run, cut to keep the pods' host names within 63 characters; the token makes a name no other
        # job (a restarted step's, still terminating) holds.
        self.base_name = manifests.job_name(self.cfg, os.environ.get(manifests.PIPELINE_RUN_NAME_ENV),
                                            uuid.uuid4().hex[:8])
        self.diagnosis = PodDiagnosis(self.apis, self.namespace, self.cfg, echo)
        self.created: list[KubeObject] = []
        # Worker 0's log first (its events make the result), then each server's: (role, index) -> its follower.
        self.followers: dict[tuple[Role, int], PodLog] = {}
        self.running: Optional[KubeObject] = None  # the job object of the current attempt
        # What the current attempt trained (worker 0's events, every worker's heartbeat records): a restart says
        # what it loses. The roles' liveness: their heartbeat records in the store, under the one stall rule.
        self.attempt = Attempt(1)
        # A role's first beat may come long after the job's first pod ran (its own pod waits for a node, pulls its
        # image, fetches its data): it has cluster.start_timeout_s more than a local process.
        ps = self.cfg.ps
        self.liveness = Liveness(job.store, self.job_name(0), ps.stall_timeout_s,
                                 self.cfg.cluster.start_timeout_s + ps.startup_timeout_s + ps.stall_timeout_s,
                                 on_progress=lambda source, epoch, examples: self.attempt.progress(source, epoch,
                                                                                                   examples))
        self.restarts: list[Restart] = []

    @classmethod
    def for_step(cls, job: PreparedJob, inputs: StepInputs) -> "KubernetesJob":
        return cls(job, inputs.data_uri, inputs.log_dir, echo=inputs.echo, lease=inputs.lease)

    @property
    def name(self) -> str:
        return self.base_name

    def job_name(self, attempt: int) -> str:
        """A relaunched job gets a new name: the old pods may still be terminating under theirs."""
        return self.base_name if attempt == 0 else f"{self.base_name}-r{attempt}"

    def prepare(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for role, index in [(Role.WORKER, 0)] + [(Role.SERVER, i) for i in range(self.cfg.ps.servers)]:
            name = f"{role.value}-{index}"
            self.followers[role, index] = PodLog(self.apis, self.namespace, name, self.echo,
                                                 self.log_dir / f"{name}.log", self.poll_s,
                                                 events=self._feed if name == WORKER_0 else None)

    def where(self) -> str:
        return f"{self.cfg.cluster.backend.value} in namespace {self.namespace}, data {self.data_uri}"

    def stop_guard(self) -> CancelOnSigterm:
        return CancelOnSigterm(self.base_name)

    def start(self) -> None:
        for follower in self.followers.values():
            follower.start()
        self._launch(0)

    def follow(self) -> None:
        """Wait for the job's outcome. A role that stops heartbeating (:mod:`components.train.liveness`) has the
        launcher delete the job and create it again, as does a failed job of a kind that restarts nothing itself
        (what JobSet's failurePolicy does): from the newest intact checkpoint of the run, up to ``max_restarts``
        times, after a disruption without counting, after a configuration error not at all. Then read worker 0's
        log to its end, and what the servers logged."""
        attempts = self.cfg.cluster.max_restarts + 1
        counted, launch = 0, 0
        while True:
            job = self.running
            try:
                outcome = self._wait(job)
            except RoleFailed as hung:  # a kind's own failurePolicy never sees a hung role: always the launcher's
                failure, was_disrupted, restartable = hung, False, True
            else:
                if outcome.succeeded:
                    self.echo(f"{job} succeeded ({outcome.detail})")
                    break
                failed = self.diagnosis.failed_pods(job)
                failure = self.diagnosis.failure(job, outcome, failed)
                was_disrupted = failed is not None and any(map(disrupted, failed))
                restartable = self.rules.relaunch and failure.restartable
            failed_at = time.monotonic()
            counted += not was_disrupted
            if not restartable or counted == attempts:
                raise failure
            launch += 1
            self._relaunch(launch, failure, was_disrupted, counted, attempts, failed_at)
        worker0, *servers = self.followers.values()
        if not worker0.finish(LOG_DRAIN_S):
            self.echo(f"warning: worker 0's log was not read to its end within {LOG_DRAIN_S:.0f}s; "
                      "the result may miss its last epochs or checkpoints")
        deadline = time.monotonic() + SERVER_LOG_DRAIN_S
        for server in servers:  # one deadline for all: stop() cuts what is still being read
            server.finish(max(0.0, deadline - time.monotonic()))

    def _relaunch(self, launch: int, failure: RoleFailed, was_disrupted: bool, counted: int, attempts: int,
                  failed_at: float) -> None:
        """Delete the failed attempt's objects and create the job again, resuming from the newest intact checkpoint
        this run committed (chosen here, verified, and given to the roles in their spec); one line says what the
        failure cost (:class:`components.train.restarts.Restart`)."""
        target = restart_target(self.job.store, self.job.restore, launch, self.job.plan.shard_num, self.job.run_id,
                                verify=True, warn=lambda line: self.echo(f"warning: {line}"))
        examples, seconds = self.attempt.lost_since(target.id if target is not None and target.resume else None,
                                                    until=failed_at)
        self._delete_created()
        if was_disrupted:
            self.echo(f"{failure}\n{self.running} was disrupted by the cluster (not counted); creating it again, "
                      f"starting from {target.id if target else 'scratch'}")
        else:
            restart = Restart(counted, attempts, failure.role, failure.what, target,
                              position(self.job.store, target), examples, seconds)
            self.restarts.append(restart)
            self.echo(str(failure))  # its pod is deleted next: the log lines it quotes are kept here
            self.echo(restart.line(self.base_name))
        self.attempt = Attempt(launch + 1)
        self.events.new_attempt()
        self.liveness.new_attempt(self.job_name(launch))
        self._launch(launch, replace(self.job, restore=target))

    def stop(self) -> None:
        for follower in self.followers.values():
            follower.abort()
        self._delete_created()

    def _feed(self, source: str, line: str) -> bool:
        """Worker 0's log line into the job's events and the current attempt's counts; True for an event."""
        self.attempt.feed(source, line)
        return self.events.feed(source, line)

    def _launch(self, attempt: int, job: Optional[PreparedJob] = None) -> None:
        """Create the job's objects in order; the last one is the job object, whose worker 0 is followed.
        ``job``: a relaunch's, whose roles resume from the checkpoint in its spec (what the launcher verified)."""
        bodies = manifests.job_manifests(job or self.job, name=self.job_name(attempt), namespace=self.namespace,
                                         data_uri=self.data_uri, owner=self.owner, pipeline_run=self.pipeline_run)
        for body in bodies:
            obj = KubeObject.of(body)
            self.created.append(obj)  # before the call: a cancel landing during it must still delete it
            job_reference = self._create(obj, body)  # the last one's: the job object's
        self.running = self.created[-1]
        if tls_on(self.cfg):  # owned by the job: deleted with it, so never among what this launcher deletes
            hosts = manifests.kubernetes_layout(self.cfg, self.running.name)
            labels = {key: value for key, value in bodies[-1]["metadata"]["labels"].items()
                      if key != manifests.KUEUE_QUEUE_LABEL}  # the job's labels (Kueue admits the job alone)
            for body in pod_tls.job_secrets(hosts, self.namespace, labels, job_reference):
                self._create(KubeObject.of(body), body)
        for (role, index), follower in self.followers.items():
            follower.selector = manifests.role_pod_selector(self.cfg, self.running.name, role, index)

    def _create(self, obj: KubeObject, body: dict) -> dict:
        try:
            reference = obj.create(self.apis, body)
        except ApiException as err:
            if obj in self.created:
                self.created.remove(obj)  # refused, so not ours (a 409 would name someone else's object)
            raise RuntimeError(f"cannot create {obj} in namespace {self.namespace}: {api_reason(err, obj)}") from err
        self.echo(f"created {obj}")
        return reference

    def _wait(self, job: KubeObject) -> Outcome:
        """The job's outcome; raises :class:`RoleFailed` when one of its roles stops heartbeating."""
        errors, shown = 0, ""
        since, started = time.time(), None  # started: when the first pod ran (time.monotonic())
        while True:
            self._check_store()
            try:
                status = job.status(self.apis)
                errors = 0
            except (ApiException, HTTPError) as err:
                if isinstance(err, ApiException) and err.status == 404:
                    raise PsJobError(job.name, f"{job} disappeared from namespace {self.namespace} while it ran "
                                               "(deleted by someone else?)") from err
                errors += 1
                if not transient(err) or errors > STATUS_ERRORS_TOLERATED:
                    raise RuntimeError(f"cannot read the status of {job}: {api_reason(err, job)}") from err
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
            if started is None and self.diagnosis.started(job, since):
                started = time.monotonic()
            if started is not None:
                self._check_liveness(job, started)
            time.sleep(self.poll_s)

    def _check_liveness(self, job: KubeObject, started: float) -> None:
        """Raise :class:`RoleFailed` naming the role whose heartbeat record stopped changing (the servers are not
        judged once every worker is done: worker 0 stops them)."""
        self.liveness.poll()
        if self.liveness.workers_done(self.cfg.ps.workers):
            return
        running = {name: started for name in role_names(self.cfg.ps.servers, self.cfg.ps.workers)
                   if name not in self.liveness.done}
        stalled = self.liveness.stalled(running)
        if stalled:
            source, silent = stalled[0]
            what = stall_what(silent, self.cfg.ps.stall_timeout_s)
            raise RoleFailed(source, f"PS job {job.name}: {source} {what} (its heartbeat record in "
                                     f"{self.job.store.display_uri} stopped changing)", what, restartable=True)

    def _check_store(self) -> None:
        check_lease(self.lease, f"PS job {self.base_name} stopped", "; its Kubernetes objects are deleted")

    def _delete_created(self) -> None:
        """Delete what this launcher created, job first; a failure is reported, not raised (the objects'
        ownerReference still removes them with the step's pod)."""
        while self.created:
            obj = self.created.pop()
            try:
                obj.delete(self.apis)
                self.echo(f"deleted {obj}")
            except (ApiException, HTTPError) as err:
                self.echo(f"warning: cannot delete {obj} in namespace {self.namespace}: {api_reason(err, obj)}")


def _launcher_pod() -> Optional[dict]:
    """The step's own pod as an ownerReference (POD_NAME / POD_UID from the downward API), if known."""
    name, uid = os.environ.get("POD_NAME"), os.environ.get("POD_UID")
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid} if name and uid else None

