"""What the launcher account may do: the manifests of ``k8s/rbac.yaml`` (applied once per namespace), written
apart from the job's own objects (:mod:`components.train.backends.manifests`).

Two tasks of a Kubeflow run act as that account, through its token Secret, which only they mount: the train step
(it creates, follows and deletes the PS job) and the run's exit handler (it lists what the run left by the run's
label and deletes it: :mod:`components.train.backends.kubernetes.cleanup`); with ``cluster.serving.deploy`` a third,
the deploy step (it creates the online server's InferenceService, or reads and replaces it: :mod:`components.deploy`)."""

from __future__ import annotations

from components.config import ClusterBackend, ClusterConfig, CtrConfig
from components.train.backends.manifests import INFERENCE_SERVICES, JOBSET_API, KSERVE_API, PADDLEJOB_API, TRAINER_API


def _group(api_version: str) -> str:
    return api_version.split("/")[0]


# The API resources of each backend's job objects: what the launcher creates, follows and deletes.
JOB_RESOURCES = {
    ClusterBackend.trainjob: (_group(TRAINER_API), ["trainingruntimes", "trainjobs"]),
    ClusterBackend.jobset: (_group(JOBSET_API), ["jobsets"]),
    ClusterBackend.paddlejob: (_group(PADDLEJOB_API), ["paddlejobs"]),
}
ROLE_NAME = "ctr-ps-launcher"


def launcher_token_secret(cluster: ClusterConfig) -> str:
    """The Secret holding ``cluster.service_account``'s token (k8s/rbac.yaml creates it; the train step and the exit
    handler mount it)."""
    return f"{cluster.service_account}-token"


def launcher_rbac(cfg: CtrConfig) -> list[dict]:
    """What the launcher needs to run PS jobs of ``cluster.backend`` in its namespace, and the exit handler to
    delete what a run left (apply once): the launcher account, its Role and binding, and the account's token
    Secret."""
    namespace, account = cfg.cluster.namespace, cfg.cluster.service_account
    group, resources = JOB_RESOURCES[cfg.cluster.backend]
    rules = [
        # list: the exit handler finds a run's objects by its label; watch: following a job.
        {"apiGroups": [group], "resources": resources, "verbs": ["create", "get", "list", "watch", "delete"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
         "verbs": ["create", "get", "list", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    ]
    if cfg.cluster.serving.deploy:
        # Create cannot be limited to a name (the object has none until it exists); reading and replacing can.
        rules += [{"apiGroups": [_group(KSERVE_API)], "resources": [INFERENCE_SERVICES], "verbs": ["create"]},
                  {"apiGroups": [_group(KSERVE_API)], "resources": [INFERENCE_SERVICES],
                   "resourceNames": [cfg.cluster.serving.name], "verbs": ["get", "update"]}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace},
         "automountServiceAccountToken": False},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
         "metadata": {"name": launcher_token_secret(cfg.cluster), "namespace": namespace,
                      "annotations": {"kubernetes.io/service-account.name": account}}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": ROLE_NAME, "namespace": namespace}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": ROLE_NAME, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE_NAME},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
    ]
