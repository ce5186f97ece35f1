"""What the launcher account may do: the manifests of ``k8s/rbac.yaml`` (applied once per namespace), written
apart from the job's own objects (:mod:`components.train.backends.manifests`).

Two tasks of a Kubeflow run act as that account, through short-lived tokens of it that only they request (bound to
their pods, no token Secret): the train step (it creates, follows and deletes the PS job) and the run's exit handler
(it lists what the run left by the run's label and deletes it: :mod:`components.train.backends.kubernetes.cleanup`);
with ``cluster.serving.deploy`` a third, the deploy step (it creates the online server's InferenceService, or reads
and replaces it: :mod:`components.deploy`). Any pod of the run's account could request such a token too: what
the account may do is limited (the Role, the admission policy), not who may become it."""

from __future__ import annotations

from components.config import ClusterBackend, CtrConfig
from components.ps.tls import tls_on
from components.train.backends.manifests import (INFERENCE_SERVICES, JOB_LABEL, JOBSET_API, KSERVE_API, PADDLEJOB_API,
                                                 TRAINER_API)


def _group(api_version: str) -> str:
    return api_version.split("/")[0]


# The API resources of each backend's job objects: what the launcher creates, follows and deletes.
JOB_RESOURCES = {
    ClusterBackend.trainjob: (_group(TRAINER_API), ["trainingruntimes", "trainjobs"]),
    ClusterBackend.jobset: (_group(JOBSET_API), ["jobsets"]),
    ClusterBackend.paddlejob: (_group(PADDLEJOB_API), ["paddlejobs"]),
}
ROLE_NAME = "ctr-ps-launcher"


TOKEN_ROLE_NAME = "ctr-ps-launcher-token"


def token_requester(cfg: CtrConfig) -> list[dict]:
    """The Role and binding that let ``cluster.pipeline_service_account`` (the steps' pods) request tokens of the
    launcher account, and of no other (``resourceNames``): the steps that act as the launcher get short-lived
    tokens bound to their pods (:func:`components.train.backends.kubernetes.api.launcher_configuration`) instead
    of a token Secret that never expires."""
    namespace, account = cfg.cluster.namespace, cfg.cluster.service_account
    rule = {"apiGroups": [""], "resources": ["serviceaccounts/token"], "resourceNames": [account], "verbs": ["create"]}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": TOKEN_ROLE_NAME, "namespace": namespace}, "rules": [rule]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": TOKEN_ROLE_NAME, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TOKEN_ROLE_NAME},
         "subjects": [{"kind": "ServiceAccount", "name": cfg.cluster.pipeline_service_account,
                       "namespace": namespace}]},
    ]


# What the launcher may do and Kubernetes RBAC cannot scope to names: create (an object has no name before it exists),
# and read (the names are made per run, by the launcher and by the job's controllers; admission never sees a read).
UNNAMED_VERBS = {"create", "get", "list", "watch"}
POLICY_NAME = "ctr-ps-launcher-deletes-its-own"


def launcher_policy(cfg: CtrConfig) -> list[dict]:
    """The ValidatingAdmissionPolicy (Kubernetes >= 1.30; cluster-scoped: a cluster admin applies it) and its binding
    that scope what RBAC cannot: the launcher account may create, and delete, only objects labelled as a PS job's
    (:data:`~components.train.backends.manifests.JOB_LABEL`), and Secrets (with ``ps.tls`` on) of that label only.
    Its deletes are otherwise unscoped in the Role, since each run names its objects anew."""
    namespace, account = cfg.cluster.namespace, cfg.cluster.service_account
    group, resources = JOB_RESOURCES[cfg.cluster.backend]
    operations = ["CREATE", "DELETE"]
    rules = [{"apiGroups": [group], "apiVersions": ["*"], "operations": operations, "resources": resources},
             {"apiGroups": ["networking.k8s.io"], "apiVersions": ["*"], "operations": operations,
              "resources": ["networkpolicies"]}]
    if tls_on(cfg):
        rules.append({"apiGroups": [""], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["secrets"]})
    name = f"{POLICY_NAME}.{namespace}"

    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": rules},
                  "matchConditions": [{"name": "the-launcher-account", "expression":
                                       f"request.userInfo.username == 'system:serviceaccount:{namespace}:{account}'"}],
                  "variables": [{"name": "obj", "expression":
                                 "request.operation == 'DELETE' ? oldObject : object"}],
                  "validations": [{"expression": f"has(variables.obj.metadata.labels) && "
                                                 f"'{JOB_LABEL}' in variables.obj.metadata.labels",
                                   "message": f"the launcher account {account} creates and deletes PS job objects only "
                                              f"(labelled {JOB_LABEL})"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name},
         "spec": {"policyName": name, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {
                      "matchLabels": {"kubernetes.io/metadata.name": namespace}}}}},
    ]


def launcher_rbac(cfg: CtrConfig) -> list[dict]:
    """What the launcher needs to run PS jobs of ``cluster.backend`` in its namespace, and the exit handler to
    delete what a run left (apply once): the launcher account (no token Secret), its Role and binding, what lets
    the steps request its tokens (:func:`token_requester`); then :func:`launcher_policy`, which limits its creates
    and deletes to PS job objects.

    Every verb is scoped as far as Kubernetes lets it be: by name (``resourceNames``) where the name is known
    before the run (the InferenceService); by the admission policy's label rule for deletes; create and the reads
    (:data:`UNNAMED_VERBS`) cannot be."""
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
    if tls_on(cfg):
        # The job's TLS Secrets (components.train.backends.pod_tls): created, never read; the job owns and deletes them.
        rules.append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]})
    if cfg.cluster.serving.deploy:
        # Create cannot be limited to a name (the object has none until it exists); reading and replacing can.
        rules += [{"apiGroups": [_group(KSERVE_API)], "resources": [INFERENCE_SERVICES], "verbs": ["create"]},
                  {"apiGroups": [_group(KSERVE_API)], "resources": [INFERENCE_SERVICES],
                   "resourceNames": [cfg.cluster.serving.name], "verbs": ["get", "update"]}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace},
         "automountServiceAccountToken": False},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": ROLE_NAME, "namespace": namespace}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": ROLE_NAME, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE_NAME},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
        *token_requester(cfg),
        *launcher_policy(cfg),
    ]
