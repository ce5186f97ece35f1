"""What the deploy step runs: the online server's InferenceService (:mod:`components.deploy.inference_service`)
created, or updated when it exists, then waited for until KServe reports it Ready; returns its URL.

An update is a read-modify-write: the object is read, its spec replaced by the config's and its labels by ours
(other labels, annotations, finalizers and the status stay), and written back with the ``resourceVersion`` it was
read at, so a change made in between (KServe's controller writing the status, a person editing it) is never
overwritten: the API server refuses the write (HTTP 409) and the step reads it again. An update that changes the
spec raises the object's ``generation``; the step waits for a status of that generation (``observedGeneration``),
not for the Ready condition an earlier spec left.

The step acts as the launcher account (``cluster.service_account``, whose token it mounts), which may create, get
and update this one InferenceService (:mod:`components.train.backends.rbac`).
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Optional

from kubernetes.client.exceptions import ApiException

from components.redaction import redact
from components.config import CtrConfig, from_dict
from components.deploy.inference_service import KIND, PLURAL, SERVING_API, inference_service
from components.export.store import export_store_uri
from components.train.backends.kubernetes.api import (REQUEST_TIMEOUT_S, KubeApis, KubeObject, api_reason,
                                                      launcher_namespace, transient)

POLL_S = 5.0
# Writes refused because the object changed since it was read, in a row, before the step gives up.
CONFLICT_RETRIES = 5


class DeployError(RuntimeError):
    """The InferenceService could not be written, or was not Ready in time: one line naming it and why."""


def _resource(namespace: str) -> tuple[str, str, str, str]:
    group, version = SERVING_API.split("/")
    return group, version, namespace, PLURAL


def _get(custom: Any, namespace: str, name: str) -> Optional[dict]:
    """The object, None when there is none."""
    try:
        return custom.get_namespaced_custom_object(*_resource(namespace), name, _request_timeout=REQUEST_TIMEOUT_S)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def updated(existing: dict, desired: dict) -> dict:
    """``existing`` with ``desired``'s spec and labels: what a replace sends (its metadata keeps the
    ``resourceVersion`` it was read at, and what others put there)."""
    body = copy.deepcopy(existing)
    body["spec"] = desired["spec"]
    body["metadata"]["labels"] = {**(existing["metadata"].get("labels") or {}), **desired["metadata"]["labels"]}
    return body


def apply(custom: Any, desired: dict) -> dict:
    """Create ``desired``, or update the object of its name (:func:`updated`); returns the object as written."""
    namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
    for _ in range(CONFLICT_RETRIES):
        existing = _get(custom, namespace, name)
        try:
            if existing is None:
                return custom.create_namespaced_custom_object(*_resource(namespace), desired,
                                                              _request_timeout=REQUEST_TIMEOUT_S)
            return custom.replace_namespaced_custom_object(*_resource(namespace), name, updated(existing, desired),
                                                           _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as err:
            if err.status != 409:  # 409: created or changed since it was read; read it again
                raise
    raise DeployError(f"{KIND} {name} in {namespace} changed {CONFLICT_RETRIES} times while the deploy step wrote it; "
                      "run the step again")


def ready_url(obj: dict) -> Optional[str]:
    """The URL of an InferenceService whose status is of its current spec and Ready; None otherwise. A status
    without ``observedGeneration`` is taken as current."""
    status = obj.get("status") or {}
    generation = obj["metadata"].get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and observed is not None and observed < generation:
        return None
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    return (status.get("url") or "") if ready else None


def not_ready_reason(obj: Optional[dict]) -> str:
    """Why the object is not Ready, as its status tells: the conditions that are not True."""
    status = (obj or {}).get("status") or {}
    failing = [f"{c.get('type')}: {c.get('reason') or c.get('status')}" + (f" ({c['message']})" if c.get("message")
                                                                             else "")
               for c in status.get("conditions") or () if c.get("status") != "True"]
    return "; ".join(failing) or "no status from KServe yet (is its controller running?)"


def wait_ready(custom: Any, namespace: str, name: str, timeout_s: float, poll_s: float = POLL_S,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> str:
    """Poll the InferenceService until it is Ready (:func:`ready_url`) and return its URL; a connection problem
    or server error counts as not ready yet. Raises :class:`DeployError` after ``timeout_s``."""
    deadline = clock() + timeout_s
    obj: Optional[dict] = None
    while True:
        try:
            obj = _get(custom, namespace, name)
        except Exception as err:
            if not transient(err):
                raise
        url = ready_url(obj) if obj is not None else None
        if url is not None:
            return url
        if clock() >= deadline:
            raise DeployError(f"{KIND} {name} in {namespace} was not Ready after {timeout_s:g} s "
                              f"(cluster.serving.ready_timeout_s): {not_ready_reason(obj)}; see kubectl describe "
                              f"inferenceservice {name} -n {namespace}")
        sleep(poll_s)


def deploy(cfg: CtrConfig, apis: Optional[KubeApis] = None, poll_s: float = POLL_S) -> str:
    """Create or update ``cfg``'s InferenceService in the launcher's namespace and wait until it is Ready; returns
    its URL. API errors become :class:`DeployError` in one line."""
    apis = apis or KubeApis.from_environment()
    namespace, name = launcher_namespace(cfg.cluster), cfg.cluster.serving.name
    desired = inference_service(cfg, namespace)
    try:
        written = apply(apis.custom, desired)
        generation = written["metadata"].get("generation")
        print(f"deploy: {KIND} {name} in {namespace} written (generation {generation}), serving "
              f"{redact(export_store_uri(cfg))}; waiting until it is Ready", flush=True)
        url = wait_ready(apis.custom, namespace, name, cfg.cluster.serving.ready_timeout_s, poll_s)
    except ApiException as err:
        raise DeployError(f"{KIND} {name} in {namespace}: "
                          f"{api_reason(err, KubeObject(SERVING_API, KIND, name, namespace))}") from None
    print(f"deploy: {KIND} {name} is Ready at {url}", flush=True)
    return url


def deploy_model(config: Any) -> str:
    """The deploy step: :func:`deploy` of the run's effective config."""
    return deploy(from_dict(config))
