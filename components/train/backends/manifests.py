"""The Kubernetes objects of a PS job: pure functions from the config to manifests (plain dicts).

Two backends fan the job out to pods:

* ``jobset`` (kubernetes-sigs JobSet ``v1alpha2``): a ``ps`` replicated job of CPU server pods and a
  ``worker`` replicated job of (GPU) worker pods. Pods get stable DNS names
  ``<job>-<ps|worker>-<i>-0.<job>``, so the Paddle environment is computed up front by the same
  :func:`components.ps.contract.role_env` the local backend uses. Servers start first (``InOrder``: workers
  are created once every server pod is Ready, i.e. the rendezvous store on server 0 listens); the job succeeds
  when the workers do; a failure restarts the whole job (all pods, blocking until the old ones are gone)
  up to ``cluster.max_restarts`` times, and the roles then resume from the latest committed checkpoint.
* ``paddlejob`` (PaddleFlow paddle-operator ``batch.paddlepaddle.org/v1``): ``ps`` / ``worker`` specs with
  ``intranet: Service``; the operator names pods ``<job>-<ps|worker>-<i>``, gives each a headless service
  on ports 36000-36019 and sets POD_IP (the pod name) and PADDLE_TRAINER_ID itself.

Security: pods run as non-root without privilege escalation or capabilities and without an API token;
credentials arrive only as ``secretKeyRef`` variables; images are pinned by digest when one is given; a
NetworkPolicy admits TCP between the job's own pods only; ``cluster.mesh_encryption`` labels the
pods for Istio's ambient mode (ztunnel mTLS without sidecars, which would keep Jobs from completing).
"""

from __future__ import annotations

from typing import Optional

from components.config import ClusterBackend, CtrConfig, PodConfig
from components.ps.contract import (INDEX_ENV, RESTART_ENV, SPEC_ENV, ClusterLayout, Role, host_layout,
                                    ready_probe_command, role_env)
from components.train.job import PreparedJob

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
PADDLEJOB_API = "batch.paddlepaddle.org/v1"
# paddle-operator exposes PADDLE_PORT .. PADDLE_PORT+19 on each pod's service and serves gloo at +18.
PADDLEJOB_PORT = 36000
GLOO_PORT_OFFSET = 18
JOB_LABEL = "ctr-ps.paddle/job"
ROLE_LABEL = "ctr-ps.paddle/role"
SCRATCH = "/scratch"  # an emptyDir: workdir, staged table shards, the pod's copy of its data shards
REPLICATED_JOB = {Role.SERVER: "ps", Role.WORKER: "worker"}
# The pod annotations JobSet sets, read through the downward API.
JOBSET_INDEX_FIELD = "metadata.annotations['jobset.sigs.k8s.io/job-index']"
JOBSET_RESTART_FIELD = "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"


def gloo_port(cfg: CtrConfig) -> int:
    return cfg.cluster.paddle_port + GLOO_PORT_OFFSET


def pod_host(cfg: CtrConfig, name: str, role: Role, index: str | int) -> str:
    """A pod's stable DNS name (``index`` may be a ``$(VAR)`` reference in an env template)."""
    if cfg.cluster.backend is ClusterBackend.paddlejob:
        return f"{name}-{REPLICATED_JOB[role]}-{index}"
    return f"{name}-{REPLICATED_JOB[role]}-{index}-0.{name}"  # <jobset>-<rjob>-<job index>-<pod index>.<subdomain>


def kubernetes_layout(cfg: CtrConfig, name: str) -> ClusterLayout:
    return host_layout(lambda role, i: pod_host(cfg, name, role, i), cfg.ps.servers, cfg.ps.workers,
                       cfg.cluster.paddle_port, gloo_port(cfg), job_id=name)


def role_env_template(cfg: CtrConfig, layout: ClusterLayout, role: Role) -> list[dict]:
    """One pod template's env for every index of ``role``: :func:`role_env`, with what depends on the index
    taken from the pod (JobSet's job-index annotation; for a PaddleJob, the operator's own variables).

    Kubernetes expands ``$(VAR)`` from variables defined earlier in the list, so the index comes first.
    """
    count = layout.servers if role is Role.SERVER else layout.workers
    envs = [role_env(layout, role, i) for i in range(count)]
    per_index = {key for key in envs[0] if any(env[key] != envs[0][key] for env in envs)}
    index_ref = f"$({INDEX_ENV})"
    if cfg.cluster.backend is ClusterBackend.paddlejob:
        # The operator appends POD_IP and PADDLE_TRAINER_ID (later entries win); it exposes no index we can read.
        templated: dict[str, Optional[str]] = {"POD_IP": None, "PADDLE_TRAINER_ID": None, INDEX_ENV: None}
        head: list[dict] = []
    else:
        templated = {INDEX_ENV: None, "PADDLE_TRAINER_ID": index_ref,
                     "POD_IP": pod_host(cfg, layout.job_id, role, index_ref)}
        head = [{"name": INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": JOBSET_INDEX_FIELD}}}]
    unexpected = per_index - set(templated)
    if unexpected:  # role_env grew an index-dependent variable this template cannot express
        raise ValueError(f"role_env varies with the index in {sorted(unexpected)}; template them in manifests.py")
    env = head + [{"name": key, "value": value} for key, value in envs[0].items() if key not in templated]
    env += [{"name": key, "value": value} for key, value in templated.items()
            if value is not None and key in envs[0]]
    return env


def _secret_env(cfg: CtrConfig) -> list[dict]:
    return [{"name": env, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": key}}}
            for secret in cfg.cluster.storage_secrets for env, key in secret.keys.items()]


def _resources(pods: PodConfig) -> dict:
    requests = {"cpu": pods.cpu, "memory": pods.memory}
    limits = {"memory": pods.memory}  # no CPU limit: throttling a PS server stalls every worker
    if pods.gpus > 0:
        limits["nvidia.com/gpu"] = str(pods.gpus)
    return {"requests": requests, "limits": limits}


def pod_security_context(cfg: CtrConfig) -> dict:
    uid = cfg.cluster.run_as_user
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"}}


CONTAINER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "privileged": False,
                              "capabilities": {"drop": ["ALL"]}}


def pod_labels(cfg: CtrConfig, name: str, role: Role) -> dict[str, str]:
    labels = {JOB_LABEL: name, ROLE_LABEL: role.value, "app.kubernetes.io/name": "ctr-ps",
              "app.kubernetes.io/component": role.value}
    if cfg.cluster.mesh_encryption:
        labels["istio.io/dataplane-mode"] = "ambient"
    return labels


def pod_template(cfg: CtrConfig, name: str, role: Role, spec_json: str, attempt: int) -> dict:
    pods = cfg.cluster.servers if role is Role.SERVER else cfg.cluster.workers
    layout = kubernetes_layout(cfg, name)
    port = cfg.cluster.paddle_port
    if cfg.cluster.backend is ClusterBackend.jobset:
        restart = {"name": RESTART_ENV, "valueFrom": {"fieldRef": {"fieldPath": JOBSET_RESTART_FIELD}}}
    else:  # the launcher recreates a failed PaddleJob and counts the attempts itself
        restart = {"name": RESTART_ENV, "value": str(attempt)}
    env = (role_env_template(cfg, layout, role) + [restart, {"name": SPEC_ENV, "value": spec_json},
                                                   {"name": "HOME", "value": SCRATCH},
                                                   {"name": "PYTHONUNBUFFERED", "value": "1"}]
           + _secret_env(cfg))
    ports = [{"name": "ps", "containerPort": port, "protocol": "TCP"}]
    if role is Role.SERVER:
        ports.append({"name": "gloo", "containerPort": gloo_port(cfg), "protocol": "TCP"})
    container = {
        "name": role.value,
        "image": pods.image.reference,
        "command": ["python", "-m", "components.ps.role"],
        "workingDir": SCRATCH,
        "env": env,
        "ports": ports,
        "resources": _resources(pods),
        "securityContext": CONTAINER_SECURITY_CONTEXT,
        "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH}],
    }
    if role is Role.SERVER:
        # JobSet creates the workers once every server is Ready. Server 0 opens its PS port only after every
        # process joined the gloo rendezvous it hosts, so Ready means what the local launcher waits for: the
        # rendezvous store listens (workers then wait for each PS port themselves).
        container["readinessProbe"] = {"exec": {"command": ready_probe_command([layout.gloo_endpoint])},
                                       "periodSeconds": 3, "timeoutSeconds": 3}
    spec = {
        "restartPolicy": "Never",  # a PS job cannot take one process back mid-run: the whole job restarts
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(cfg),
        "containers": [container],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    }
    if pods.node_selector:
        spec["nodeSelector"] = dict(pods.node_selector)
    if pods.tolerations:
        spec["tolerations"] = [{k: v for k, v in vars(t).items() if v not in (None, "")} for t in pods.tolerations]
    return {"metadata": {"labels": pod_labels(cfg, name, role)}, "spec": spec}


def _metadata(cfg: CtrConfig, name: str, namespace: str, owner: Optional[dict]) -> dict:
    metadata = {"name": name, "namespace": namespace,
                "labels": {JOB_LABEL: name, "app.kubernetes.io/name": "ctr-ps"}}
    if owner:  # garbage-collected with the launcher pod, whatever happens to the launcher
        metadata["ownerReferences"] = [{**owner, "blockOwnerDeletion": False, "controller": False}]
    return metadata


def jobset(cfg: CtrConfig, name: str, namespace: str, spec_json: str, owner: Optional[dict]) -> dict:
    def replicated(role: Role, replicas: int) -> dict:
        job = {"parallelism": 1, "completions": 1, "backoffLimit": 0,
               "template": pod_template(cfg, name, role, spec_json, attempt=0)}
        return {"name": REPLICATED_JOB[role], "replicas": replicas, "template": {"spec": job}}

    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": _metadata(cfg, name, namespace, owner),
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name, "publishNotReadyAddresses": True},
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [REPLICATED_JOB[Role.WORKER]]},
            "failurePolicy": {"maxRestarts": cfg.cluster.max_restarts, "restartStrategy": "BlockingRecreate"},
            "replicatedJobs": [replicated(Role.SERVER, cfg.ps.servers), replicated(Role.WORKER, cfg.ps.workers)],
        },
    }


def paddlejob(cfg: CtrConfig, name: str, namespace: str, spec_json: str, owner: Optional[dict], attempt: int) -> dict:
    def role_spec(role: Role, replicas: int) -> dict:
        return {"replicas": replicas, "template": pod_template(cfg, name, role, spec_json, attempt)}

    return {
        "apiVersion": PADDLEJOB_API,
        "kind": "PaddleJob",
        "metadata": _metadata(cfg, name, namespace, owner),
        # Never: a failed job's pods stay for the launcher to quote their logs; it deletes the job (and pods) itself.
        "spec": {"intranet": "Service", "cleanPodPolicy": "Never", "withGloo": 1,
                 "ps": role_spec(Role.SERVER, cfg.ps.servers), "worker": role_spec(Role.WORKER, cfg.ps.workers)},
    }


# Istio ambient's mTLS tunnel (HBONE): ztunnel carries the pods' traffic to this port of the receiving pod.
HBONE_PORT = 15008


def network_policy(cfg: CtrConfig, name: str, namespace: str, owner: Optional[dict]) -> dict:
    """The job's pods take TCP from each other on any port, and nothing from anyone else.

    Any port, not only the PS and gloo ports: gloo's worker-to-worker transport listens on ephemeral ports
    (34077 in one local run). With ``cluster.mesh_encryption`` the policy also admits Istio ambient's tunnel
    port from anywhere, as Istio documents: ztunnel authenticates that traffic by mTLS identity.
    """
    ingress = [{"from": [{"podSelector": {"matchLabels": {JOB_LABEL: name}}}], "ports": [{"protocol": "TCP"}]}]
    if cfg.cluster.mesh_encryption:
        ingress.append({"ports": [{"protocol": "TCP", "port": HBONE_PORT}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(cfg, f"{name}-ps", namespace, owner),
        "spec": {"podSelector": {"matchLabels": {JOB_LABEL: name}}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def job_manifests(job: PreparedJob, *, name: str, namespace: str, data_uri: str, attempt: int = 0,
                  owner: Optional[dict] = None) -> list[dict]:
    """The objects to create, in order: the NetworkPolicy (if enabled), then the JobSet or PaddleJob."""
    cfg = job.cfg
    spec_json = job.spec(data_uri, f"{SCRATCH}/work", f"{SCRATCH}/staging").to_json()
    objects = [network_policy(cfg, name, namespace, owner)] if cfg.cluster.network_policy else []
    if cfg.cluster.backend is ClusterBackend.jobset:
        objects.append(jobset(cfg, name, namespace, spec_json, owner))
    elif cfg.cluster.backend is ClusterBackend.paddlejob:
        objects.append(paddlejob(cfg, name, namespace, spec_json, owner, attempt))
    else:
        raise ValueError(f"cluster.backend {cfg.cluster.backend.value!r} does not run on Kubernetes")
    return objects


def job_pods_selector(name: str) -> str:
    return f"{JOB_LABEL}={name}"


def worker0_selector(cfg: CtrConfig, name: str) -> str:
    if cfg.cluster.backend is ClusterBackend.paddlejob:
        return f"paddle-res-name={name}-worker-0"  # the operator's per-pod label
    return (f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name=worker,"
            "jobset.sigs.k8s.io/job-index=0")


def launcher_rbac(cfg: CtrConfig) -> list[dict]:
    """What the train step's service account needs to run PS jobs in its namespace (apply once)."""
    namespace, account = cfg.cluster.namespace, cfg.cluster.service_account
    role_name = "ctr-ps-launcher"
    manage = ["create", "get", "list", "watch", "delete"]
    rules = [
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": manage},
        {"apiGroups": ["batch.paddlepaddle.org"], "resources": ["paddlejobs"], "verbs": manage},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create", "get", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    ]
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": role_name, "namespace": namespace}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": role_name, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
    ]
