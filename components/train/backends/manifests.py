"""The Kubernetes objects of a PS job: pure functions from the config to manifests (plain dicts).

Three backends fan the job out to pods:

* ``trainjob`` (Kubeflow Trainer v2, ``trainer.kubeflow.org/v1alpha1``): a TrainingRuntime of this job, whose
  ``spec.template.spec`` is a JobSet spec holding a ``ps`` replicated job of server pods and the trainer-ancestor
  ``node`` job of worker pods (each one Indexed Job), and a TrainJob referencing it with ``numNodes`` = workers,
  ``resourcesPerNode`` and the workers' env. Trainer builds a JobSet of the same name from them, so pods are named
  ``<job>-<ps|node>-0-<i>.<job>`` and the job behaves as the ``jobset`` one below. Trainer's admission webhook
  requires the trainer-ancestor job to have ``replicas: 1`` and a container named ``node``, and Trainer gives
  the TrainJob's ``numNodes``, env and resources to that job only (and to any container named ``node``, so the
  servers' container is ``server``).
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

Preemption is not failure (``trainjob``, ``jobset``): each Job's ``podFailurePolicy`` fails it at once, with a
message naming the cause, when a pod exits with the contract's configuration-error status or is disrupted by the
cluster (the ``DisruptionTarget`` condition: preemption, eviction, node drain); the JobSet's
``failurePolicy.rules`` then fail the whole job for the first and restart it without using up
``cluster.max_restarts`` for the second. Any other failure restarts it and counts.

Security and multi-user namespaces: pods run as non-root without privilege escalation or capabilities, on a
read-only root filesystem (emptyDirs at the scratch directory and /tmp) and without an API token; credentials arrive only as ``secretKeyRef`` variables; images are pinned by digest when
one is given and pulled with ``cluster.image_pull_secrets``; a NetworkPolicy admits TCP between the job's own
pods only and lets them reach nothing but each other, the cluster DNS and the store
(:mod:`~components.train.backends.network_policy`); the pods opt out of Istio sidecar injection (a sidecar keeps a
Job's pod from completing) unless ``cluster.mesh_encryption`` puts them in Istio's ambient mode (ztunnel mTLS
without sidecars), else each role runs behind its TLS terminator (``ps.tls``: :mod:`~.pod_tls`); a
``cluster.queue_name`` puts the TrainJob or JobSet in a Kueue queue.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import Optional

from components.config import ClusterBackend, CtrConfig, PodConfig, to_dict
from components.ps.contract import (CONFIG_ERROR_EXIT, STORE_REFUSED_EXIT, INDEX_ENV, RESTART_ENV, SPEC_ENV, ClusterLayout, JobSpec, Role,
                                    host_layout, ready_probe_command, role_env)
from components.ps.tls import store_on_loopback, tls_on
from components.train.backends import pod_tls
from components.train.backends.network_policy import policy_spec
from components.train.job import PreparedJob
from components.train.planner import job_plan

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
PADDLEJOB_API = "batch.paddlepaddle.org/v1"
TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_API = f"{TRAINER_GROUP}/v1alpha1"
# The online server's KServe InferenceService (components.deploy), which the launcher account may create too.
KSERVE_API, INFERENCE_SERVICES = "serving.kserve.io/v1beta1", "inferenceservices"
# paddle-operator exposes PADDLE_PORT .. PADDLE_PORT+19 on each pod's service and serves gloo at +18.
PADDLEJOB_PORT = 36000
GLOO_PORT_OFFSET = 18
JOB_LABEL = "ctr-ps.paddle/job"
ROLE_LABEL = "ctr-ps.paddle/role"
GLOO_ENDPOINT_ENV = "PADDLE_GLOO_HTTP_ENDPOINT"  # role_env's address of the rendezvous store on server 0
SCRATCH = "/scratch"  # an emptyDir: workdir, staged table shards, the pod's copy of its data shards
WORKDIR, STAGING = f"{SCRATCH}/work", f"{SCRATCH}/staging"
REPLICATED_JOB = {Role.SERVER: "ps", Role.WORKER: "worker"}
# Kubeflow Trainer patches the replicated job labelled as the trainer ancestor from the TrainJob; its webhook
# requires that job to have replicas: 1 and a container named "node" (pkg/webhooks/trainingruntime_webhook.go).
TRAINER_ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
# The kubeflow SDK (TrainerClient, kubeflow 0.5) lists only runtimes carrying this label; the value names ours.
TRAINER_FRAMEWORK_LABEL, TRAINER_FRAMEWORK = "trainer.kubeflow.org/framework", "paddle-ps"
# Trainer 2.4 refuses replicated-job names over 20 characters (kubeflow/trainer#4394); a pod's host name,
# <trainjob>-<replicated job>-<job index>-<pod index>, must fit a DNS label (kubeflow/trainer#2734).
MAX_REPLICATED_JOB_NAME, MAX_HOST_NAME = 20, 63
RUN_NAME_HASH = 8  # hex digits of the hash that ends a job name cut short (job_name)
TRAINER_ANCESTOR = "trainer"
TRAINER_NODE = "node"
TRAINER_REPLICATED_JOB = {Role.SERVER: "ps", Role.WORKER: TRAINER_NODE}
# A TrainJob's pods name their hosts after the JobSet Trainer made for it (the TrainJob's name), read from the pod's
# JobSet label into JOB_NAME_ENV: so one runtime serves TrainJobs of any name (the ClusterTrainingRuntime, a TrainJob
# the kubeflow SDK names), not only the one the launcher names after its runtime.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"  # JobSet sets it on every pod (under a TrainJob: its name)
JOBSET_NAME_FIELD, JOB_NAME_ENV = f"metadata.labels['{JOBSET_NAME_LABEL}']", "PS_JOB_NAME"
# The pod annotations JobSet (under a TrainJob too) and an Indexed Job set, read through the downward API.
JOBSET_INDEX_FIELD = "metadata.annotations['jobset.sigs.k8s.io/job-index']"
JOBSET_RESTART_FIELD = "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# Istio injects no sidecar into a pod with this label "false"; a sidecar keeps a Job's pod from completing.
SIDECAR_INJECT_LABEL = "sidecar.istio.io/inject"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The Job failure messages of the Kubernetes job controller's podFailurePolicy FailJob rules
# (pkg/controller/job/pod_failure_policy.go), which JobSet's failurePolicy.rules match (RE2 patterns).
CONFIG_ERROR_MESSAGE = f"failed with exit code {CONFIG_ERROR_EXIT} matching FailJob rule"
STORE_REFUSED_MESSAGE = f"failed with exit code {STORE_REFUSED_EXIT} matching FailJob rule"
DISRUPTION_MESSAGE = "has condition DisruptionTarget matching FailJob rule"
# The account (cluster.service_account) whose short-lived tokens a step that acts as the launcher requests with its
# own pod's account (cluster.pipeline_service_account): components.train.backends.kubernetes.api.
LAUNCHER_ACCOUNT_ENV = "CTR_PS_LAUNCHER_ACCOUNT"
# Every object of a PS job carries the Kubeflow run that created it, so that the run's exit handler finds what a
# cancelled or failed run left (components.train.backends.kubernetes.cleanup). KFP labels each pod of a run with
# its run id (KFP_RUN_LABEL); the train step reads it from PIPELINE_RUN_ENV (set from that label, downward API).
PIPELINE_RUN_LABEL = "ctr-ps.paddle/pipeline-run"
KFP_RUN_LABEL = "pipeline/runid"
PIPELINE_RUN_ENV = "PIPELINE_RUN_ID"
# The launcher names its job after the run's Argo workflow (KFP's engine labels each pod of a run with it: a name a
# person can tell, `ctr-ps-training-x7k2p`); an empty value (another engine) names it ctr-ps-<random> (job_name).
KFP_WORKFLOW_LABEL, PIPELINE_RUN_NAME_ENV = "workflows.argoproj.io/workflow", "PIPELINE_RUN_NAME"


def gloo_port(cfg: CtrConfig) -> int:
    return cfg.cluster.paddle_port + GLOO_PORT_OFFSET


def replicated_job(cfg: CtrConfig, role: Role) -> str:
    """The name of ``role``'s replicated job (the PaddleJob spec key for a PaddleJob)."""
    return (TRAINER_REPLICATED_JOB if cfg.cluster.backend is ClusterBackend.trainjob else REPLICATED_JOB)[role]


def container_name(cfg: CtrConfig, role: Role) -> str:
    """A TrainJob's workers run in the ``node`` container Trainer requires; nothing else may be so named,
    since Trainer gives every ``node`` container the TrainJob's env and resources."""
    return TRAINER_NODE if cfg.cluster.backend is ClusterBackend.trainjob and role is Role.WORKER else role.value


def pod_host(cfg: CtrConfig, name: str, role: Role, index: str | int) -> str:
    """A pod's stable DNS name (``index`` may be a ``$(VAR)`` reference in an env template)."""
    job = replicated_job(cfg, role)
    if cfg.cluster.backend is ClusterBackend.paddlejob:
        return f"{name}-{job}-{index}"
    if cfg.cluster.backend is ClusterBackend.trainjob:  # one Indexed Job per replicated job: the pod index varies
        return f"{name}-{job}-0-{index}.{name}"
    return f"{name}-{job}-{index}-0.{name}"  # <jobset>-<rjob>-<job index>-<pod index>.<subdomain>


def job_name(cfg: CtrConfig, run_name: Optional[str], token: str) -> str:
    """The name of a job the launcher creates: ``<run name>-<token>`` (``ctr-ps-<token>`` without a run name),
    as a DNS label. A run name too long for the job's longest pod host name (a relaunch's, the last index) to fit
    :data:`MAX_HOST_NAME` is cut and ends in a hash of the whole, so two long names with one beginning differ."""
    longest = max(len(pod_host(cfg, "", role, max(count - 1, 0)).split(".")[0])
                  for role, count in ((Role.SERVER, cfg.ps.servers), (Role.WORKER, cfg.ps.workers)))
    budget = MAX_HOST_NAME - longest - len(f"-r{cfg.cluster.max_restarts}") - len(f"-{token}")
    stem = "-".join(re.findall(r"[a-z0-9]+", (run_name or "").lower()))
    if not stem[:1].isalpha():  # a DNS-1035 label starts with a letter
        stem = "-".join(filter(None, ("ctr-ps", stem)))
    if len(stem) > budget:
        digest = hashlib.sha256((run_name or "").encode()).hexdigest()[:RUN_NAME_HASH]
        stem = f"{stem[:budget - RUN_NAME_HASH - 1].rstrip('-')}-{digest}"
    return f"{stem}-{token}"


def host_base(cfg: CtrConfig, name: str) -> str:
    """What a pod's host names start with: the job's name, or for a TrainJob its JobSet's name as the pod reads it
    (:data:`JOB_NAME_ENV`, expanded by the kubelet)."""
    return f"$({JOB_NAME_ENV})" if cfg.cluster.backend is ClusterBackend.trainjob else name


def kubernetes_layout(cfg: CtrConfig, name: str) -> ClusterLayout:
    return host_layout(lambda role, i: pod_host(cfg, name, role, i), cfg.ps.servers, cfg.ps.workers,
                       cfg.cluster.paddle_port, gloo_port(cfg), job_id=name)


def role_env_template(cfg: CtrConfig, layout: ClusterLayout, role: Role) -> list[dict]:
    """One pod template's env for every index of ``role``: :func:`role_env`, with what depends on the index
    taken from the pod (JobSet's job-index annotation, an Indexed Job's completion index; for a PaddleJob, the
    operator's own variables).

    Kubernetes expands ``$(VAR)`` from variables defined earlier in the list, so the index (and a TrainJob's
    JobSet name, :func:`host_base`) comes first.
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
        index_field = COMPLETION_INDEX_FIELD if cfg.cluster.backend is ClusterBackend.trainjob else JOBSET_INDEX_FIELD
        templated = {INDEX_ENV: None, "PADDLE_TRAINER_ID": index_ref,
                     "POD_IP": pod_host(cfg, layout.job_id, role, index_ref)}
        head = [{"name": INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": index_field}}}]
        if cfg.cluster.backend is ClusterBackend.trainjob:
            head.insert(0, {"name": JOB_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": JOBSET_NAME_FIELD}}})
    unexpected = per_index - set(templated)
    if unexpected:  # role_env grew an index-dependent variable this template cannot express
        raise ValueError(f"role_env varies with the index in {sorted(unexpected)}; template them in manifests.py")
    env = head + [{"name": key, "value": value} for key, value in envs[0].items() if key not in templated]
    env += [{"name": key, "value": value} for key, value in templated.items()
            if value is not None and key in envs[0]]
    return env


def storage_secret_env(cfg: CtrConfig) -> list[dict]:
    """``cluster.storage_secrets`` as a container's env: secret references only, never the values."""
    return [{"name": env, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": key}}}
            for secret in cfg.cluster.storage_secrets for env, key in secret.keys.items()]


def _resources(pods: PodConfig) -> dict:
    requests = {"cpu": pods.cpu, "memory": pods.memory}
    limits = {"memory": pods.memory}  # no CPU limit unless asked for: throttling a PS server stalls every worker
    if pods.cpu_limit is not None:
        limits["cpu"] = pods.cpu_limit
    if pods.gpus > 0:
        limits["nvidia.com/gpu"] = str(pods.gpus)
    return {"requests": requests, "limits": limits}


def pod_security_context(cfg: CtrConfig) -> dict:
    uid = cfg.cluster.run_as_user
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"}}


CONTAINER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "privileged": False,
                              "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}
# A PS container's writable places, each an emptyDir (the root filesystem is read-only): SCRATCH (HOME too: Paddle's
# ~/.cache, matplotlib's ~/.config) and /tmp (Python's tempfile, glog's log files when not logging to stderr).
TMP = "/tmp"
WRITABLE_MOUNTS = {"scratch": SCRATCH, "tmp": TMP}


def pod_labels(cfg: CtrConfig, name: str, role: Role) -> dict[str, str]:
    labels = {JOB_LABEL: name, ROLE_LABEL: role.value, "app.kubernetes.io/name": "ctr-ps",
              "app.kubernetes.io/component": role.value}
    if cfg.cluster.mesh_encryption:
        labels["istio.io/dataplane-mode"] = "ambient"
    else:
        labels[SIDECAR_INJECT_LABEL] = "false"
    return labels


def pod_template(cfg: CtrConfig, name: str, role: Role, spec_json: str) -> dict:
    pods = cfg.cluster.servers if role is Role.SERVER else cfg.cluster.workers
    layout = kubernetes_layout(cfg, host_base(cfg, name))
    port = cfg.cluster.paddle_port
    # A JobSet restarts its pods in place: they resume from the run's newest checkpoint. A PaddleJob is recreated by
    # the launcher, whose spec names the checkpoint it resumes from (chosen and verified there).
    restart = ([] if cfg.cluster.backend is ClusterBackend.paddlejob
               else [{"name": RESTART_ENV, "valueFrom": {"fieldRef": {"fieldPath": JOBSET_RESTART_FIELD}}}])
    env = (role_env_template(cfg, layout, role) + restart + [{"name": SPEC_ENV, "value": spec_json},
                                                             {"name": "HOME", "value": SCRATCH},
                                                             {"name": "PYTHONUNBUFFERED", "value": "1"}]
           + storage_secret_env(cfg))
    ports = [{"name": "ps", "containerPort": port, "protocol": "TCP"}]
    if role is Role.SERVER:
        ports.append({"name": "gloo", "containerPort": gloo_port(cfg), "protocol": "TCP"})
    container = {
        "name": container_name(cfg, role),
        "image": pods.image.reference,
        "command": ["python", "-m", "components.ps.role"],
        "workingDir": SCRATCH,
        "env": env,
        "ports": ports,
        "resources": _resources(pods),
        "securityContext": CONTAINER_SECURITY_CONTEXT,
        "volumeMounts": [{"name": volume, "mountPath": path} for volume, path in WRITABLE_MOUNTS.items()],
        # A role that fails leaves no termination message; the end of its log (its error) becomes it.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    secure = tls_on(cfg)
    if role is Role.SERVER:
        # JobSet creates the workers once every server is Ready. Server 0 opens its PS port only after every
        # process joined the gloo rendezvous it hosts, so Ready means what the local launcher waits for: the
        # rendezvous store listens (workers then wait for each PS port themselves). The kubelet expands no $(VAR)
        # in a probe: the store's address comes from the env it expanded (PADDLE_GLOO_HTTP_ENDPOINT), by the shell.
        # Behind a terminator, which accepts before the store listens, the probe asks the store's loopback port.
        store = store_on_loopback(layout).gloo_endpoint if secure else f'"${GLOO_ENDPOINT_ENV}"'
        probe = shlex.join(ready_probe_command([]))
        container["readinessProbe"] = {"exec": {"command": ["sh", "-c", f"exec {probe} {store}"]},
                                       "periodSeconds": 3, "timeoutSeconds": 3}
    spec = {
        "restartPolicy": "Never",  # a PS job cannot take one process back mid-run: the whole job restarts
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(cfg),
        "containers": [container],
        "volumes": [{"name": volume, "emptyDir": {}} for volume in WRITABLE_MOUNTS],
    }
    if secure:
        pod_tls.secure_pod(spec, container, name, role)
    if cfg.cluster.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": secret} for secret in cfg.cluster.image_pull_secrets]
    if pods.node_selector:
        spec["nodeSelector"] = dict(pods.node_selector)
    if pods.tolerations:
        spec["tolerations"] = [{k: v for k, v in vars(t).items() if v not in (None, "")} for t in pods.tolerations]
    return {"metadata": {"labels": pod_labels(cfg, name, role)}, "spec": spec}


def _metadata(cfg: CtrConfig, name: str, namespace: str, owner: Optional[dict], queued: bool = False) -> dict:
    """``queued``: the object Kueue admits (the TrainJob or JobSet), labelled with ``cluster.queue_name``."""
    metadata = {"name": name, "namespace": namespace,
                "labels": {JOB_LABEL: name, "app.kubernetes.io/name": "ctr-ps"}}
    if queued and cfg.cluster.queue_name:
        metadata["labels"][KUEUE_QUEUE_LABEL] = cfg.cluster.queue_name
    if owner:  # garbage-collected with the launcher pod, whatever happens to the launcher
        metadata["ownerReferences"] = [{**owner, "blockOwnerDeletion": False, "controller": False}]
    return metadata


def pod_failure_policy(cfg: CtrConfig, role: Role) -> dict:
    """A Job's podFailurePolicy: a configuration error, a store's refusal and a disruption each fail it at once,
    with a message that says which (:data:`CONFIG_ERROR_MESSAGE`, :data:`STORE_REFUSED_MESSAGE`,
    :data:`DISRUPTION_MESSAGE`)."""
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": container_name(cfg, role), "operator": "In",
                                              "values": [CONFIG_ERROR_EXIT, STORE_REFUSED_EXIT]}},
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]}


def jobset_failure_policy(cfg: CtrConfig) -> dict:
    """Restart the whole job after a failure, up to ``cluster.max_restarts`` times; a configuration error or a
    store that refused a write fails it at once, a disruption restarts it without counting."""
    pod_failure = ["PodFailurePolicy"]  # the reason of a Job that a podFailurePolicy FailJob rule failed
    return {"maxRestarts": cfg.cluster.max_restarts, "restartStrategy": "BlockingRecreate", "rules": [
        {"name": "ConfigurationError", "action": "FailJobSet", "onJobFailureReasons": pod_failure,
         "onJobFailureMessagePatterns": [CONFIG_ERROR_MESSAGE]},
        {"name": "StoreRefused", "action": "FailJobSet", "onJobFailureReasons": pod_failure,
         "onJobFailureMessagePatterns": [STORE_REFUSED_MESSAGE]},
        {"name": "Disrupted", "action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": pod_failure,
         "onJobFailureMessagePatterns": [DISRUPTION_MESSAGE]},
    ]}


def _replicated_job(cfg: CtrConfig, name: str, role: Role, spec_json: str, replicas: int, pods: int) -> dict:
    """``replicas`` Jobs of ``pods`` pods each; any pod failing fails its Job (the policy decides what follows)."""
    # Indexed: pods get their index (COMPLETION_INDEX_FIELD) and JobSet their host names from it.
    job = {"parallelism": pods, "completions": pods, "completionMode": "Indexed", "backoffLimit": 0,
           "podFailurePolicy": pod_failure_policy(cfg, role),
           "template": pod_template(cfg, name, role, spec_json)}
    return {"name": replicated_job(cfg, role), "replicas": replicas, "template": {"spec": job}}


def _jobset_spec(cfg: CtrConfig, name: str, replicated_jobs: list[dict]) -> dict:
    network = {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    if cfg.cluster.backend is not ClusterBackend.trainjob:  # a TrainJob's JobSet defaults it to its own name
        network["subdomain"] = name
    return {
        "network": network,
        "startupPolicy": {"startupPolicyOrder": "InOrder"},  # servers (listed first) before workers
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [replicated_job(cfg, Role.WORKER)]},
        "failurePolicy": jobset_failure_policy(cfg),
        "replicatedJobs": replicated_jobs,
    }


def jobset(cfg: CtrConfig, name: str, namespace: str, spec_json: str, owner: Optional[dict]) -> dict:
    replicated = [_replicated_job(cfg, name, Role.SERVER, spec_json, replicas=cfg.ps.servers, pods=1),
                  _replicated_job(cfg, name, Role.WORKER, spec_json, replicas=cfg.ps.workers, pods=1)]
    return {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": _metadata(cfg, name, namespace, owner, queued=True),
            "spec": _jobset_spec(cfg, name, replicated)}


def training_runtime(cfg: CtrConfig, name: str, namespace: str, spec_json: str, owner: Optional[dict]) -> dict:
    """This job's TrainingRuntime: a JobSet template of one Indexed ``ps`` Job of the servers and the
    trainer-ancestor ``node`` Job of the workers, whose env and resources the TrainJob gives (see :func:`trainjob`)."""
    servers = _replicated_job(cfg, name, Role.SERVER, spec_json, replicas=1, pods=cfg.ps.servers)
    workers = _replicated_job(cfg, name, Role.WORKER, spec_json, replicas=1, pods=cfg.ps.workers)
    workers["template"]["metadata"] = {"labels": {TRAINER_ANCESTOR_LABEL: TRAINER_ANCESTOR}}
    node = workers["template"]["spec"]["template"]["spec"]["containers"][0]
    del node["env"], node["resources"]  # given by the TrainJob (trainer.env, resourcesPerNode), as Trainer intends
    metadata = _metadata(cfg, name, namespace, owner)
    metadata["labels"][TRAINER_FRAMEWORK_LABEL] = TRAINER_FRAMEWORK
    return {"apiVersion": TRAINER_API, "kind": "TrainingRuntime", "metadata": metadata,
            "spec": {"mlPolicy": {"numNodes": cfg.ps.workers},
                     "template": {"spec": _jobset_spec(cfg, name, [servers, workers])}}}


def trainjob(cfg: CtrConfig, name: str, namespace: str, spec_json: str, owner: Optional[dict]) -> dict:
    """The TrainJob running :func:`training_runtime` (of the same name): ``numNodes`` workers with the workers'
    resources and env (the pod template's, which Trainer puts on the ``node`` container)."""
    node = pod_template(cfg, name, Role.WORKER, spec_json)["spec"]["containers"][0]
    return {"apiVersion": TRAINER_API, "kind": "TrainJob",
            "metadata": _metadata(cfg, name, namespace, owner, queued=True),
            "spec": {"runtimeRef": {"apiGroup": TRAINER_GROUP, "kind": "TrainingRuntime", "name": name},
                     "trainer": {"numNodes": cfg.ps.workers, "resourcesPerNode": node["resources"],
                                 "env": node["env"]}}}


def paddlejob(cfg: CtrConfig, name: str, namespace: str, spec_json: str, owner: Optional[dict]) -> dict:
    def role_spec(role: Role, replicas: int) -> dict:
        return {"replicas": replicas, "template": pod_template(cfg, name, role, spec_json)}

    return {
        "apiVersion": PADDLEJOB_API,
        "kind": "PaddleJob",
        "metadata": _metadata(cfg, name, namespace, owner),
        # Never: a failed job's pods stay for the launcher to quote their logs; it deletes the job (and pods) itself.
        "spec": {"intranet": "Service", "cleanPodPolicy": "Never", "withGloo": 1,
                 "ps": role_spec(Role.SERVER, cfg.ps.servers), "worker": role_spec(Role.WORKER, cfg.ps.workers)},
    }


def job_pod_selector(cfg: CtrConfig, name: str) -> dict[str, str]:
    """The labels that select every pod of the job ``name``, as its controller sets them: JobSet's name label (a
    TrainJob's JobSet has the TrainJob's name); paddle-operator labels each pod apart, so a PaddleJob's pods are
    selected by the job label of their template (:func:`pod_labels`)."""
    if cfg.cluster.backend is ClusterBackend.paddlejob:
        return {JOB_LABEL: name}
    return {JOBSET_NAME_LABEL: name}


def network_policy(cfg: CtrConfig, name: str, namespace: str, owner: Optional[dict], store_uris: list[Optional[str]]
                   ) -> dict:
    """The job's NetworkPolicy (:func:`~components.train.backends.network_policy.policy_spec`) over the pods the
    job's controller labels (:func:`job_pod_selector`)."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _metadata(cfg, f"{name}-ps", namespace, owner),
            "spec": policy_spec(cfg, job_pod_selector(cfg, name), store_uris)}


def _job_objects(cfg: CtrConfig, spec_json: str, *, name: str, namespace: str,
                 owner: Optional[dict], data_uri: str) -> list[dict]:
    """``data_uri``: where the pods read the dataset (with ``checkpoint.uri`` and a warm start's store, what the
    NetworkPolicy lets them reach)."""
    store_uris = [data_uri, cfg.checkpoint.uri, cfg.checkpoint.warm_start]
    objects = [network_policy(cfg, name, namespace, owner, store_uris)] if cfg.cluster.network_policy else []
    if cfg.cluster.backend is ClusterBackend.trainjob:
        objects += [training_runtime(cfg, name, namespace, spec_json, owner),
                    trainjob(cfg, name, namespace, spec_json, owner)]
    elif cfg.cluster.backend is ClusterBackend.jobset:
        objects.append(jobset(cfg, name, namespace, spec_json, owner))
    elif cfg.cluster.backend is ClusterBackend.paddlejob:
        objects.append(paddlejob(cfg, name, namespace, spec_json, owner))
    else:
        raise ValueError(f"cluster.backend {cfg.cluster.backend.value!r} does not run on Kubernetes")
    return objects


def job_manifests(job: PreparedJob, *, name: str, namespace: str, data_uri: str,
                  owner: Optional[dict] = None, pipeline_run: Optional[str] = None) -> list[dict]:
    """The objects to create, in order: the NetworkPolicy (if enabled), then the job: a TrainingRuntime and the
    TrainJob running it, a JobSet or a PaddleJob. The job object (the one to follow) is the last. Each is
    labelled with ``pipeline_run`` (:data:`PIPELINE_RUN_LABEL`), the Kubeflow run creating it, if known."""
    spec_json = job.spec(data_uri, WORKDIR, STAGING).to_json()
    objects = _job_objects(job.cfg, spec_json, name=name, namespace=namespace, owner=owner, data_uri=data_uri)
    if pipeline_run:
        for obj in objects:
            obj["metadata"]["labels"][PIPELINE_RUN_LABEL] = pipeline_run
    return objects


def pipeline_run_selector(pipeline_run: str) -> str:
    return f"{PIPELINE_RUN_LABEL}={pipeline_run}"


def pod_data_uri(dataset_uri: str) -> str:
    """Where pods read the Dataset artifact: KFP on MinIO names artifacts minio://bucket/..., the same object
    through fsspec's S3 (the endpoint comes from the storage secret's AWS_ENDPOINT_URL)."""
    return dataset_uri.replace("minio://", "s3://", 1)


REVIEW_NAME = "ctr-ps-review"


def review_manifests(cfg: CtrConfig, data_uri: str, name: str = REVIEW_NAME, baseline_uri: str = "") -> list[dict]:
    """The objects the train step creates for ``cfg`` in ``cluster.namespace``, written before any run for a
    platform team to review (``kubectl apply --dry-run=server -f``). What only the run decides differs: the name
    (:func:`job_name`), ``data_uri`` (the run's Dataset artifact) and ``baseline_uri`` (its fit-baseline step's
    Model artifact), the restore target of ``checkpoint.resume`` (read from the store when the step starts; none
    here) and the owner (the step's pod)."""
    spec = JobSpec(config=to_dict(cfg), plan=job_plan(cfg), data_dir=pod_data_uri(data_uri), workdir=WORKDIR,
                   staging_dir=STAGING, baseline=pod_data_uri(baseline_uri) if baseline_uri else "")
    return _job_objects(cfg, spec.to_json(), name=name, namespace=cfg.cluster.namespace, owner=None,
                        data_uri=spec.data_dir)


def job_pods_selector(name: str) -> str:
    return f"{JOB_LABEL}={name}"


def role_pod_selector(cfg: CtrConfig, name: str, role: Role, index: Optional[int] = None) -> str:
    """The pods of ``role`` number ``index`` (every index: None) of the job object ``name``, by the labels its
    controller sets (not the job label: a runtime's pods carry the runtime's name, whatever TrainJob runs them)."""
    rjob = replicated_job(cfg, role)
    if cfg.cluster.backend is ClusterBackend.paddlejob:
        if index is None:
            raise ValueError("paddle-operator labels each pod of a role apart: name its index")
        return f"paddle-res-name={name}-{rjob}-{index}"  # the operator's per-pod label
    selector = f"{JOBSET_NAME_LABEL}={name},jobset.sigs.k8s.io/replicatedjob-name={rjob}"
    if index is None:
        return selector
    # Trainer's JobSet has the TrainJob's name and one Indexed Job per role: the pod's completion index is the role's.
    key = COMPLETION_INDEX_LABEL if cfg.cluster.backend is ClusterBackend.trainjob else "jobset.sigs.k8s.io/job-index"
    return f"{selector},{key}={index}"


def pod_index(cfg: CtrConfig, pod_name: str, labels: dict[str, str]) -> Optional[str]:
    """A pod's index among its role (``None`` if the pod is not one of this job's roles)."""
    if cfg.cluster.backend is ClusterBackend.trainjob:
        return labels.get(COMPLETION_INDEX_LABEL)
    if cfg.cluster.backend is ClusterBackend.jobset:
        return labels.get("jobset.sigs.k8s.io/job-index")
    return labels.get("paddle-res-name", pod_name).rpartition("-")[2] or None  # <job>-<ps|worker>-<i>
