"""What the controllers of a cluster do with the job objects, as far as the tests need it, written from their
sources (no Kubernetes API server can run here):

* Kubeflow Trainer: its TrainingRuntime admission webhook (``pkg/webhooks/trainingruntime_webhook.go``) and how
  it builds the JobSet of a TrainJob (``pkg/runtime/framework/plugins/jobset/builder.go`` and ``plainml``);
* the Kubernetes Job controller's ``podFailurePolicy`` (``pkg/controller/job/pod_failure_policy.go``);
* JobSet's ``failurePolicy`` (``pkg/controllers/failure_policy.go``, with ``onJobFailureMessagePatterns``);
* how JobSet (under a TrainJob too) and paddle-operator name and label the pods of a job (:func:`job_pod`).
"""

from __future__ import annotations

import copy
import re
import uuid
from typing import Optional

from components.train.backends.manifests import TRAINER_ANCESTOR_LABEL

# Trainer's ancestor steps and the container each must have.
ANCESTOR_CONTAINERS = {"trainer": "node", "model-initializer": "model-initializer",
                       "dataset-initializer": "dataset-initializer"}


def training_runtime_errors(runtime: dict) -> list[str]:
    """What Trainer's webhook refuses in a TrainingRuntime: an ancestor replicated job whose replicas are not 1
    or that lacks its required container (``node`` for the trainer)."""
    errors = []
    for i, rjob in enumerate(runtime["spec"]["template"]["spec"]["replicatedJobs"]):
        ancestor = ((rjob["template"].get("metadata") or {}).get("labels") or {}).get(TRAINER_ANCESTOR_LABEL)
        if ancestor not in ANCESTOR_CONTAINERS:
            continue
        path = f"spec.template.spec.replicatedJobs[{i}]"
        if rjob.get("replicas", 1) != 1:
            errors.append(f"{path}.replicas: Invalid value: {rjob.get('replicas')}: always must be 1")
        containers = rjob["template"]["spec"]["template"]["spec"]["containers"]
        if not any(c["name"] == ANCESTOR_CONTAINERS[ancestor] for c in containers):
            errors.append(f"{path}.template.spec.template.spec.containers: must contain the required container "
                          f"for the ancestor: {ancestor}")
    return errors


def _upsert_env(env: list[dict], entries: list[dict]) -> list[dict]:
    """Trainer's apply.UpsertEnvVars: an entry replaces the one of its name in place, else is appended."""
    env = list(env)
    for entry in entries:
        names = [e["name"] for e in env]
        if entry["name"] in names:
            env[names.index(entry["name"])] = entry
        else:
            env.append(entry)
    return env


def trainjob_jobset(runtime: dict, trainjob: dict) -> dict:
    """The JobSet Trainer creates for ``trainjob`` from ``runtime``: named after the TrainJob, owned by it; the
    trainer-ancestor job gets replicas 1 and numNodes pods; every ``node`` container the TrainJob's resources and
    env (builder.Trainer loops over all replicated jobs)."""
    assert trainjob["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert not training_runtime_errors(runtime), training_runtime_errors(runtime)
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    trainer = trainjob["spec"].get("trainer") or {}
    nodes = trainer.get("numNodes", runtime["spec"].get("mlPolicy", {}).get("numNodes", 1))
    for rjob in spec["replicatedJobs"]:
        labels = (rjob["template"].get("metadata") or {}).get("labels") or {}
        if labels.get(TRAINER_ANCESTOR_LABEL) == "trainer":
            rjob["replicas"] = 1
            rjob["template"]["spec"]["parallelism"] = rjob["template"]["spec"]["completions"] = nodes
        for container in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            if container["name"] != "node":
                continue
            if trainer.get("resourcesPerNode"):
                container["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
            container["env"] = _upsert_env(container.get("env") or [], trainer.get("env") or [])
    name = trainjob["metadata"]["name"]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": trainjob["metadata"]["namespace"],
                         "ownerReferences": [{"apiVersion": trainjob["apiVersion"], "kind": "TrainJob", "name": name,
                                              "uid": "trainjob-uid", "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec}


BACKOFF_LIMIT_EXCEEDED = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")


def job_failure(job_spec: dict, namespace: str, pod_name: str, container: str, exit_code: int,
                conditions: tuple[str, ...] = ()) -> tuple[str, str]:
    """``(reason, message)`` of the Job ``job_spec`` failed by one pod (backoffLimit 0): the first podFailurePolicy
    rule it matches decides (``conditions``: the pod's True condition types)."""
    for index, rule in enumerate((job_spec.get("podFailurePolicy") or {}).get("rules") or []):
        codes = rule.get("onExitCodes")
        if codes is not None:
            named = codes.get("containerName") in (None, container)
            matched = named and exit_code != 0 and ((exit_code in codes["values"]) == (codes["operator"] == "In"))
            message = (f"Container {container} for pod {namespace}/{pod_name} failed with exit code {exit_code} "
                       f"matching {rule['action']} rule at index {index}")
        else:
            found = [p["type"] for p in rule["onPodConditions"] if p["type"] in conditions and p["status"] == "True"]
            matched = bool(found)
            message = (f"Pod {namespace}/{pod_name} has condition {found[0] if found else ''} matching "
                       f"{rule['action']} rule at index {index}")
        if matched:
            assert rule["action"] == "FailJob", rule  # the only action these manifests use
            return "PodFailurePolicy", message
    return BACKOFF_LIMIT_EXCEEDED


def jobset_action(failure_policy: dict, replicated_job: str, reason: str, message: str) -> tuple[str, Optional[str]]:
    """``(action, rule name)`` of JobSet's failurePolicy for a failed Job: the first rule whose reasons, message
    patterns and target replicated jobs all match; else RestartJobSet."""
    for rule in failure_policy.get("rules") or []:
        if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
            continue
        patterns = rule.get("onJobFailureMessagePatterns")
        if patterns and not any(re.search(p, message) for p in patterns):
            continue
        if rule.get("targetReplicatedJobs") and replicated_job not in rule["targetReplicatedJobs"]:
            continue
        return rule["action"], rule["name"]
    return "RestartJobSet", None


def jobset_after_failure(status: dict, failure_policy: dict, action: str, failed_job: str) -> dict:
    """The JobSet status once ``action`` was applied: a restart (counted or not), or the Failed condition."""
    status = copy.deepcopy(status)
    restarts, counted = status.get("restarts", 0), status.get("restartsCountTowardsMax", 0)
    if action == "FailJobSet":
        return {**status, "conditions": [{"type": "Failed", "status": "True", "reason": "FailJobSetAction",
                                          "message": f"applying FailJobSet failure policy action "
                                                     f"(first failed job: {failed_job})"}]}
    if action == "RestartJobSet" and counted >= failure_policy.get("maxRestarts", 0):
        return {**status, "conditions": [{"type": "Failed", "status": "True", "reason": "ReachedMaxRestarts",
                                          "message": f"jobset failed due to reaching max number of restarts "
                                                     f"(first failed job: {failed_job})"}]}
    assert action in ("RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"), action
    return {**status, "restarts": restarts + 1, "restartsCountTowardsMax": counted + (action == "RestartJobSet")}


def replicated_jobs(jobset: dict) -> dict[str, dict]:
    return {rj["name"]: rj for rj in jobset["spec"]["replicatedJobs"]}


def running_jobset(body: dict, runtime: Optional[dict]) -> Optional[dict]:
    """The JobSet that runs a job object: the JobSet itself, the one Trainer builds for a TrainJob from its
    ``runtime``; None for a PaddleJob."""
    if body["kind"] == "TrainJob":
        return trainjob_jobset(runtime, body)
    return body if body["kind"] == "JobSet" else None


def pod_templates(body: dict, runtime: Optional[dict]) -> dict[str, dict]:
    """A job object's pod templates by role: ``ps``, ``worker``."""
    jobset = running_jobset(body, runtime)
    if jobset is None:
        return {key: body["spec"][key]["template"] for key in ("ps", "worker")}
    rjobs = replicated_jobs(jobset)
    return {"ps": rjobs["ps"]["template"]["spec"]["template"],
            "worker": rjobs["node" if body["kind"] == "TrainJob" else "worker"]["template"]["spec"]["template"]}


def job_pod(body: dict, role: str, index: int, runtime: Optional[dict]) -> tuple[str, dict, str]:
    """``(name, labels, container)`` of the pod of ``role`` (ps | worker) number ``index`` of a job object, as
    the controllers name and label it."""
    name = body["metadata"]["name"]
    template = pod_templates(body, runtime)[role]
    labels = dict(template["metadata"]["labels"])
    suffix = uuid.uuid4().hex[:5]
    if body["kind"] == "JobSet":
        pod_name = f"{name}-{role}-{index}-0-{suffix}"
        labels.update({"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": role,
                       "jobset.sigs.k8s.io/job-index": str(index)})
    elif body["kind"] == "TrainJob":  # one Indexed Job per replicated job
        rjob = "node" if role == "worker" else role
        pod_name = f"{name}-{rjob}-0-{index}-{suffix}"
        labels.update({"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                       "jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": str(index)})
    else:
        pod_name = f"{name}-{role}-{index}"
        labels["paddle-res-name"] = pod_name
    return pod_name, labels, template["spec"]["containers"][0]["name"]


def kubelet_env(container_env, fields, appended=(), env_from=None):
    """The environment a container sees: ``envFrom`` first, then ``env`` in order (later entries of the same
    name win), ``fieldRef`` values from ``fields``, ``$(VAR)`` expanded from variables defined before."""
    env = dict(env_from or {})
    for entry in list(container_env) + list(appended):
        if "value" in entry:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), entry["value"])
        elif "fieldRef" in entry["valueFrom"]:
            value = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            value = "<secret {name}/{key}>".format(**entry["valueFrom"]["secretKeyRef"])
        env[entry["name"]] = value
    return env


_REQUIREMENT = re.compile(r"\s*(?P<key>[\w./-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[\w.-]*)"
                          r"|\s+(?P<set_op>in|notin)\s*\((?P<values>[^)]*)\))?\s*(?:,|$)")


def selects(selector: Optional[str], labels: dict) -> bool:
    """Whether a label selector (equality and set-based requirements, existence) selects ``labels``."""
    if not selector:
        return True
    position = 0
    while position < len(selector):
        match = _REQUIREMENT.match(selector, position)
        if not match or match.end() == position:
            raise ValueError(f"unparsable label selector {selector!r}")
        position = match.end()
        key, present = match["key"], match["key"] in labels
        if match["op"]:
            if (labels.get(key) == match["value"]) != (match["op"] != "!="):
                return False
        elif match["set_op"]:
            values = {v.strip() for v in match["values"].split(",")}
            if (present and labels[key] in values) != (match["set_op"] == "in"):
                return False
        elif not present:
            return False
    return True
