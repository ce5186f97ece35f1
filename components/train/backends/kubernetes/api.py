"""The Kubernetes API as the launcher calls it: its clients (:class:`KubeApis`), the objects it creates
(:class:`KubeObject`), and what an API error means for the user (:func:`api_reason`)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from kubernetes.client.exceptions import ApiException

from components.config import ClusterConfig
from components.train.backends import manifests

# Every API call but the log stream gets a deadline, so a hung API server cannot hang the step.
REQUEST_TIMEOUT_S = 30
# The launcher account's tokens (launcher_configuration): an hour each (the API server's minimum is 10 minutes),
# renewed five minutes before they expire.
LAUNCHER_TOKEN_S, TOKEN_RENEW_S = 3600, 300
PROPAGATION = "Background"  # the pods are deleted with their job
STARTED_PHASES = ("Running", "Succeeded", "Failed")  # pod phases
ENDED_PHASES = ("Succeeded", "Failed")


@dataclass
class KubeApis:
    """The API clients the launcher calls (injected in tests)."""

    custom: Any  # CustomObjectsApi: TrainingRuntime, TrainJob, JobSet, PaddleJob
    core: Any  # CoreV1Api: pods and their logs
    networking: Any  # NetworkingV1Api: NetworkPolicy

    @classmethod
    def from_environment(cls) -> "KubeApis":
        """Clients acting as the launcher account that ``$CTR_PS_LAUNCHER_ACCOUNT`` names (a pipeline step:
        :func:`launcher_configuration`); without it, as the pod's own service account, else as the kubeconfig's
        user (a developer's machine)."""
        from kubernetes import client, config

        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)
            return cls.of(configuration)
        account = os.environ.get(manifests.LAUNCHER_ACCOUNT_ENV)
        return cls.of(launcher_configuration(configuration, account) if account else configuration)

    @classmethod
    def of(cls, configuration: Any) -> "KubeApis":
        """Clients of the API server ``configuration`` (a ``kubernetes.client.Configuration``) names."""
        from kubernetes import client

        api = client.ApiClient(configuration)
        return cls(custom=client.CustomObjectsApi(api), core=client.CoreV1Api(api),
                   networking=client.NetworkingV1Api(api))


def launcher_configuration(own: Any, account: str, lifetime_s: int = LAUNCHER_TOKEN_S) -> Any:
    """A client configuration of the API server ``own`` (the pod's account's) that acts as ``account``, in the pod's
    namespace, with tokens the pod's account requests (TokenRequest: ``serviceaccounts/token``, which
    ``k8s/rbac.yaml`` lets it create for that account alone): each lives ``lifetime_s`` seconds, is bound to this
    pod (void once the pod is gone) and is renewed :data:`TOKEN_RENEW_S` before it expires. No token of the launcher
    account is stored anywhere. A request that is refused fails here, naming the account."""
    import copy

    from kubernetes import client

    core = client.CoreV1Api(client.ApiClient(own))
    namespace = os.environ.get("POD_NAMESPACE", "")
    bound = (client.V1BoundObjectReference(api_version="v1", kind="Pod", name=os.environ["POD_NAME"],
                                           uid=os.environ["POD_UID"]) if os.environ.get("POD_UID") else None)
    launcher = copy.copy(own)
    launcher.api_key, launcher.api_key_prefix = {}, {}
    expires_at = [0.0]
    lock = threading.Lock()

    def renew(configuration: Any) -> None:
        with lock:
            if time.time() < expires_at[0] - TOKEN_RENEW_S:
                return
            request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
                audiences=[], expiration_seconds=lifetime_s, bound_object_ref=bound))
            try:
                status = core.create_namespaced_service_account_token(
                    account, namespace, request, _request_timeout=REQUEST_TIMEOUT_S).status
            except ApiException as err:
                raise PermissionError(f"cannot get a token of the launcher account {account} in namespace "
                                      f"{namespace}: {api_reason(err, None)}; apply the run directory's "
                                      "k8s/rbac.yaml (it lets the pipeline's account request one)") from None
            configuration.api_key["authorization"] = status.token
            configuration.api_key_prefix["authorization"] = "Bearer"
            expires_at[0] = status.expiration_timestamp.timestamp()

    launcher.refresh_api_key_hook = renew
    renew(launcher)
    return launcher


def launcher_namespace(cluster: ClusterConfig) -> str:
    """Where the launcher's PS jobs go: its own pod's namespace (downward API), else ``cluster.namespace``."""
    return os.environ.get("POD_NAMESPACE") or cluster.namespace


# Built-in kinds go through their typed API: (KubeApis field, method suffix). Every other kind is a custom resource.
_BUILTIN_KINDS = {("networking.k8s.io/v1", "NetworkPolicy"): ("networking", "network_policy"),
                  ("v1", "Secret"): ("core", "secret")}


@dataclass(frozen=True)
class KubeObject:
    api_version: str
    kind: str
    name: str
    namespace: str

    @classmethod
    def of(cls, body: dict) -> "KubeObject":
        return cls(body["apiVersion"], body["kind"], body["metadata"]["name"], body["metadata"]["namespace"])

    @classmethod
    def labelled(cls, apis: KubeApis, api_version: str, kind: str, namespace: str,
                 label_selector: str) -> list["KubeObject"]:
        """The objects of ``kind`` in ``namespace`` that ``label_selector`` selects."""
        of_kind = cls(api_version, kind, "", namespace)
        typed = of_kind._typed(apis, "list")
        if typed:
            items = typed(namespace, label_selector=label_selector, _request_timeout=REQUEST_TIMEOUT_S).items
            names = [item.metadata.name for item in items]
        else:
            listed = apis.custom.list_namespaced_custom_object(*of_kind._custom_resource(),
                                                               label_selector=label_selector,
                                                               _request_timeout=REQUEST_TIMEOUT_S)
            names = [item["metadata"]["name"] for item in listed["items"]]
        return [cls(api_version, kind, name, namespace) for name in names]

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

    def create(self, apis: KubeApis, body: dict) -> dict:
        """Create it; returns the reference an object it owns names it by (with the ``uid`` the server gave)."""
        typed = self._typed(apis, "create")
        if typed:
            uid = typed(self.namespace, body, _request_timeout=REQUEST_TIMEOUT_S).metadata.uid
        else:
            uid = apis.custom.create_namespaced_custom_object(*self._custom_resource(), body,
                                                              _request_timeout=REQUEST_TIMEOUT_S)["metadata"]["uid"]
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": uid}

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


def transient(err: Exception) -> bool:
    """A connection problem, a server error or throttling: worth asking again."""
    return not isinstance(err, ApiException) or err.status is None or err.status == 429 or err.status >= 500


def api_reason(err: Exception, obj: Optional[KubeObject]) -> str:
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
