"""Mutual TLS on a Kubernetes job's PS plane (``ps.tls``, :mod:`components.ps.tls`): what a pod template carries and
the Secrets the launcher creates.

Each role speaks brpc's own TLS and reaches the rendezvous store through its terminator (HAProxy), both set up in
its own container by ``python -m components.ps.tls``, which configures them from the env the template gives (the
host layout, the role, its index) and then becomes the role: the terminator lives and dies with the role, so the
Job's completion and failure rules stay the role's. The certificates come from one Secret per role of the job,
holding every index's certificate and key (a pod template serves every index; :func:`components.ps.tls.pem_name`)
and the job's CA certificate, issued when the launcher creates the job by a CA whose key is never written
(:mod:`components.ps.tls_certs`). The launcher creates them right after the job object, which it makes their owner:
Kubernetes deletes them with the job whoever deletes it, so the launcher account creates Secrets and never reads,
lists or deletes one. A pod created before its Secret waits for it (the kubelet retries the mount).
"""

from __future__ import annotations

import base64

from components.ps.contract import ClusterLayout, Role
from components.ps.tls import CA_FILE, TLS_DIR, pem_name, role_credentials

COMMAND = ["python", "-m", "components.ps.tls", "--"]
VOLUME = "tls"
# Read by the pod's user through its group (the pod's fsGroup owns a Secret volume's files); nobody else.
SECRET_MODE = 0o440


def secret_name(job: str, role: Role) -> str:
    return f"{job}-tls-{role.value}"


def secure_pod(spec: dict, container: dict, job: str, role: Role) -> None:
    """Give ``container`` (of the pod ``spec``) of ``role`` in the job ``job`` its TLS: the command wrapped, its
    role's Secret mounted read-only at :data:`~components.ps.tls.TLS_DIR`."""
    container["command"] = COMMAND + container["command"]
    container["volumeMounts"].append({"name": VOLUME, "mountPath": TLS_DIR, "readOnly": True})
    spec["volumes"].append({"name": VOLUME, "secret": {"secretName": secret_name(job, role),
                                                       "defaultMode": SECRET_MODE}})


def job_secrets(hosts: ClusterLayout, namespace: str, labels: dict[str, str], owner: dict) -> list[dict]:
    """The Secrets of the job whose pods listen at ``hosts`` (its ``job_id`` is the job's name): one per role, each
    index's certificate and key and the CA's certificate of a CA made now; ``owner``: the job object's reference."""
    data: dict[Role, dict[str, str]] = {Role.SERVER: {}, Role.WORKER: {}}
    for (role, index), issued in role_credentials(hosts).items():
        data[role].update({pem_name(role, index): _b64(issued.cert + issued.key), CA_FILE: _b64(issued.ca)})
    return [{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": secret_name(hosts.job_id, role), "namespace": namespace, "labels": dict(labels),
                          "ownerReferences": [{**owner, "blockOwnerDeletion": False, "controller": False}]},
             "data": files}
            for role, files in data.items()]


def _b64(pem: bytes) -> str:
    return base64.b64encode(pem).decode()
