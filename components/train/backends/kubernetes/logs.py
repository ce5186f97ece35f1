"""A PS job's logs by role, for whoever started it: the kubeflow SDK's ``get_job_logs`` reads only the ``node``
pods (the workers), so a TrainJob started with ``TrainerClient().train(...)`` on our runtime has its servers' logs
here::

    python -m components.train.backends.kubernetes.logs <job> [--role server|worker] [--namespace NS]
                                                          [--backend trainjob|jobset]

It prints every pod of the role, in index order, each line prefixed ``[server-<i>]``, as the train step's own
output has them; what was logged so far (``kubectl logs -f -l <the selector it names>`` follows one). It acts as
the kubeconfig's user (in a pod: the pod's account), in the context's namespace unless told another.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator, Optional

from kubernetes.client.exceptions import ApiException

from components.config import ClusterBackend, CtrConfig, from_dict
from components.ps.contract import Role
from components.train.backends import manifests
from components.train.backends.kubernetes.api import REQUEST_TIMEOUT_S, STARTED_PHASES, KubeApis

# What a pod's own account reads its namespace from.
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# paddle-operator labels each pod apart (manifests.role_pod_selector): no selector finds a role's pods.
BACKENDS = (ClusterBackend.trainjob, ClusterBackend.jobset)


class JobLogsError(RuntimeError):
    """The job's pods or their logs cannot be read (no such job, no pod started, the API refused)."""


def default_namespace() -> str:
    """The namespace kubectl would use: the pod's own, else the kubeconfig context's, else ``default``."""
    if IN_CLUSTER_NAMESPACE.is_file():
        return IN_CLUSTER_NAMESPACE.read_text().strip()
    from kubernetes import config

    try:
        _, current = config.list_kube_config_contexts()
    except (config.ConfigException, OSError):
        return "default"
    return current.get("context", {}).get("namespace") or "default"


def _backend_config(backend: ClusterBackend) -> CtrConfig:
    """A config naming only ``backend``: all that the selectors and indices read."""
    return from_dict({"cluster": {"backend": backend.value}})


def role_logs(job: str, role: Role = Role.SERVER, *, namespace: Optional[str] = None,
              backend: ClusterBackend = ClusterBackend.trainjob, apis: Optional[KubeApis] = None) -> Iterator[str]:
    """The log lines of every started pod of ``role`` in the TrainJob (or JobSet) ``job``, prefixed
    ``[<role>-<i>]``, in index order (the newest pod of an index: a restarted job's); raises
    :class:`JobLogsError` when there are none or they cannot be read."""
    if backend not in BACKENDS:
        raise JobLogsError(f"cluster.backend {backend.value}: only a {' or '.join(b.value for b in BACKENDS)}'s pods "
                           f"are found by role; read a PaddleJob's with kubectl logs <job>-ps-<i>")
    cfg, namespace = _backend_config(backend), namespace or default_namespace()
    apis = apis or KubeApis.from_environment()
    selector = manifests.role_pod_selector(cfg, job, role)
    try:
        pods = apis.core.list_namespaced_pod(namespace, label_selector=selector,
                                             _request_timeout=REQUEST_TIMEOUT_S).items
    except ApiException as err:
        raise JobLogsError(f"cannot list the pods of {job} in namespace {namespace}: HTTP {err.status} "
                           f"{err.reason}") from err
    newest: dict[int, object] = {}
    for pod in sorted((p for p in pods if p.status and p.status.phase in STARTED_PHASES),
                      key=lambda p: p.metadata.creation_timestamp):
        index = manifests.pod_index(cfg, pod.metadata.name, pod.metadata.labels or {})
        if index is not None:
            newest[int(index)] = pod
    if not newest:
        raise JobLogsError(f"no started {role.value} pod of {job} in namespace {namespace} (selector {selector})")
    for index, pod in sorted(newest.items()):
        try:
            text = apis.core.read_namespaced_pod_log(pod.metadata.name, namespace,
                                                     container=manifests.container_name(cfg, role),
                                                     _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as err:
            raise JobLogsError(f"cannot read the log of pod {pod.metadata.name}: HTTP {err.status} "
                               f"{err.reason}") from err
        for line in text.splitlines():
            yield f"[{role.value}-{index}] {line}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.train.backends.kubernetes.logs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", help="the TrainJob's (or JobSet's) name")
    parser.add_argument("--role", choices=[r.value for r in Role], default=Role.SERVER.value)
    parser.add_argument("--namespace", help="default: the kubeconfig context's")
    parser.add_argument("--backend", choices=[b.value for b in BACKENDS], default=ClusterBackend.trainjob.value)
    args = parser.parse_args(argv)
    try:
        for line in role_logs(args.job, Role(args.role), namespace=args.namespace,
                              backend=ClusterBackend(args.backend)):
            print(line, flush=True)
    except JobLogsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
