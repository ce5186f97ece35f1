"""Why a PS job on Kubernetes failed or did not start, from its pods: the pod that failed first, how (an exit
code, a configuration error, a disruption by the cluster) and the last lines of its log; or why no pod started."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from components.config import CtrConfig
from components.ps.contract import CONFIG_ERROR_EXIT, STORE_REFUSED_EXIT, STORE_REFUSED_PREFIX
from components.train.backends import manifests
from components.train.backends.kubernetes.api import REQUEST_TIMEOUT_S, STARTED_PHASES, KubeApis, KubeObject, api_reason
from components.train.backends.kubernetes.status import Outcome
from components.train.job import PsJobError, RoleFailed, RoleStoreRefused

TAIL_LINES = 30


class PodDiagnosis:
    """Reads a job's pods in ``namespace`` to say why the job failed or does not start."""

    def __init__(self, apis: KubeApis, namespace: str, cfg: CtrConfig, echo: Callable[[str], None]):
        self.apis, self.namespace, self.cfg, self.echo = apis, namespace, cfg, echo

    def _pods(self, job: KubeObject) -> list:
        return self.apis.core.list_namespaced_pod(self.namespace, label_selector=manifests.job_pods_selector(job.name),
                                                  _request_timeout=REQUEST_TIMEOUT_S).items

    def started(self, job: KubeObject, since: float) -> bool:
        """True once a pod of the job has started; a job none of whose pods start within
        ``cluster.start_timeout_s`` of ``since`` (an image that cannot be pulled, no node with a free GPU) fails
        with why."""
        try:
            pods = self._pods(job)
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

    def failed_pods(self, job: KubeObject) -> Optional[list]:
        """The job's failed pods, the first to fail first; None when they cannot be listed."""
        try:
            pods = self._pods(job)
        except (ApiException, HTTPError) as err:
            self.echo(f"warning: the pods of {job} cannot be listed: {api_reason(err, None)}")
            return None
        return sorted((p for p in pods if _pod_failure(p)), key=_failed_at)

    def failure(self, job: KubeObject, outcome: Outcome, failed: Optional[list]) -> RoleFailed:
        """The error naming the pod that failed first, quoting the last lines of its log; not restartable after a
        configuration error."""
        if failed is None:
            return RoleFailed(job.name, f"PS job {job.name}: {job} failed ({outcome.detail}); its pods cannot be "
                                        "listed", f"failed ({outcome.detail})", restartable=True)
        if not failed:
            return RoleFailed(job.name, f"PS job {job.name}: {job} failed ({outcome.detail}); no failed pod is left "
                                        "to name", f"failed ({outcome.detail})", restartable=True)
        first = failed[0]
        role = self._role_name(first)
        others = ", ".join(self._role_name(p) for p in failed[1:])
        what = _pod_failure(first)
        tail = self._log_tail(first)
        if _exited_with(first, STORE_REFUSED_EXIT):  # the user's to fix: one line with the store's own reason
            said = next((line.strip() for line in reversed(tail.splitlines())
                         if line.strip().startswith(STORE_REFUSED_PREFIX)), f"{STORE_REFUSED_PREFIX}(see its log)")
            return RoleStoreRefused(role, f"PS job {job.name}: {role}: {said}; its log: kubectl logs -n "
                                          f"{self.namespace} {first.metadata.name}", what)
        return RoleFailed(role, f"PS job {job.name}: {role} (pod {first.metadata.name}) {what} "
                                f"[{job}: {outcome.detail}]" + (f"; also failed: {others}" if others else "")
                          + f". Last lines of its log:\n{tail}", what,
                          restartable=not any(_exited_with(p, code) for p in failed
                                              for code in (CONFIG_ERROR_EXIT, STORE_REFUSED_EXIT)))

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
            return f"    (its log cannot be read: {api_reason(err, None)})"
        return "\n".join(f"    {line}" for line in text.splitlines()[-TAIL_LINES:])


def _disruption(pod: Any) -> Optional[Any]:
    """The pod's DisruptionTarget condition: the cluster stopped it (preemption, eviction, node drain)."""
    conditions = (pod.status.conditions or []) if pod.status else []
    return next((c for c in conditions if c.type == "DisruptionTarget" and c.status == "True"), None)


def disrupted(pod: Any) -> bool:
    return _disruption(pod) is not None


def _exited_with(pod: Any, code: int) -> bool:
    statuses = (pod.status.container_statuses or []) if pod.status else []
    return any(s.state and s.state.terminated and s.state.terminated.exit_code == code for s in statuses)


def config_error(pod: Any) -> bool:
    """A container exited with the PS contract's configuration-error status: no restart can mend it."""
    return _exited_with(pod, CONFIG_ERROR_EXIT)


def _pod_failure(pod: Any) -> Optional[str]:
    """How a pod failed (a container exited non-zero, or the pod failed, e.g. evicted); None if it did not."""
    disruption = _disruption(pod)
    disrupted = (f"; the cluster disrupted it ({': '.join(filter(None, (disruption.reason, disruption.message)))})"
                 if disruption else "")
    for status in (pod.status.container_statuses or []) if pod.status else []:
        terminated = status.state.terminated if status.state else None
        if terminated is not None and terminated.exit_code != 0:
            cause = " (a configuration error: restarting cannot mend it)" if config_error(pod) else (
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
