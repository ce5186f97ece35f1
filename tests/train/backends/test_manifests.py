"""The Kubernetes objects of a PS job, checked offline: against the Kubernetes client's models, the JobSet and
PaddleJob CRD schemas (../shared/schemas), and against the env the local backend gives the same roles."""

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubernetes.client import ApiClient

from components.checkpoint.restore import RestoreTarget
from components.checkpoint.store import CheckpointStore
from components.config import from_dict, to_dict, validate
from components.ps.contract import INDEX_ENV, RESTART_ENV, SPEC_ENV, Role, role_env
from components.train.backends import manifests
from components.train.job import PreparedJob, planned_config
from tests.conftest import ROOT, SCHEMAS, needs_schemas

DIGEST = "sha256:" + "ab" * 32
OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "ctr-run-train-abc", "uid": "1b2c3d4e-0000-1111-2222-333344445555"}
# What a pod gets besides the Paddle environment of its role.
EXTRA_ENV = {RESTART_ENV, SPEC_ENV, "HOME", "PYTHONUNBUFFERED", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


@pytest.fixture
def prod(config):
    """``prod(*overrides)``: a validated Kubeflow config."""
    def composed(*overrides):
        cfg = config("+cluster=prod", "cluster.submit=false", "checkpoint.uri=s3://ctr/ckpt", *overrides)
        validate(cfg)
        return cfg
    return composed


def _prepared(cfg, restore=None):
    """The job as the launcher prepares it, without asking the store (these objects are pure functions of it)."""
    return PreparedJob(planned_config(cfg, restore)[0], CheckpointStore("memory://manifests"), restore, plan=None)


def _objects(cfg, restore=None, attempt=0):
    return manifests.job_manifests(_prepared(cfg, restore), name="ctr-1a2b3c", namespace="team-a",
                                   data_uri="s3://ctr/kfp/prepare/dataset", attempt=attempt, owner=OWNER)


def _crd_schema(filename):
    crd = yaml.safe_load((SCHEMAS / filename).read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _round_trip(obj: dict, model: str) -> dict:
    """``obj`` through the Kubernetes client's model and back: a misspelt or misplaced field is dropped
    (deserialize ignores unknown keys), so comparing with the input finds it; required fields are checked."""
    client = ApiClient()
    response = type("Response", (), {"data": json.dumps(obj)})()
    return client.sanitize_for_serialization(client.deserialize(response, model))


def _pod_templates(obj):
    if obj["kind"] == "JobSet":
        return {rj["name"]: rj["template"]["spec"]["template"] for rj in obj["spec"]["replicatedJobs"]}
    return {key: obj["spec"][key]["template"] for key in ("ps", "worker")}


def _kubelet_env(container_env, fields, appended=(), env_from=None):
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


@pytest.mark.parametrize("backend", ["jobset", "paddlejob"])
def test_objects_fit_the_kubernetes_models(prod, backend):
    cfg = prod(f"cluster.backend={backend}")
    policy, job = _objects(cfg)
    assert _round_trip(policy, "V1NetworkPolicy") == policy
    for template in _pod_templates(job).values():
        assert _round_trip(template, "V1PodTemplateSpec") == template
    for obj in manifests.launcher_rbac(cfg):
        assert _round_trip(obj, f"V1{obj['kind']}") == obj


@needs_schemas
@pytest.mark.parametrize("backend", ["jobset", "paddlejob"])
def test_objects_fit_the_crd_schemas(prod, backend):
    _, job = _objects(prod(f"cluster.backend={backend}"))
    schema = _crd_schema("jobset.x-k8s.io_jobsets.yaml" if backend == "jobset"
                         else "batch.paddlepaddle.org_paddlejobs.yaml")
    jsonschema.validate(job, schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema is strict enough to catch a wrong type
        broken = json.loads(json.dumps(job))
        (broken["spec"]["replicatedJobs"][0] if backend == "jobset" else broken["spec"]["ps"])["replicas"] = "two"
        jsonschema.validate(broken, schema)


@pytest.mark.parametrize("servers,workers", [(2, 2), (3, 1)])
def test_jobset_pod_env_equals_the_local_backends_env(prod, servers, workers):
    cfg = prod(f"ps.servers={servers}", f"ps.workers={workers}")
    _, job = _objects(cfg)
    layout = manifests.kubernetes_layout(cfg, "ctr-1a2b3c")
    templates = _pod_templates(job)
    for role, count in ((Role.SERVER, servers), (Role.WORKER, workers)):
        container = templates[manifests.REPLICATED_JOB[role]]["spec"]["containers"][0]
        for index in range(count):
            fields = {manifests.JOBSET_INDEX_FIELD: str(index), manifests.JOBSET_RESTART_FIELD: "0"}
            env = _kubelet_env(container["env"], fields)
            expected = role_env(layout, role, index)
            assert {k: env[k] for k in expected} == expected
            assert set(env) - set(expected) == EXTRA_ENV
    # The endpoints are the pods' stable DNS names: <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>
    assert layout.server_endpoints[0] == "ctr-1a2b3c-ps-0-0.ctr-1a2b3c:36000"
    assert layout.gloo_endpoint == "ctr-1a2b3c-ps-0-0.ctr-1a2b3c:36018"
    assert job["spec"]["network"]["subdomain"] == "ctr-1a2b3c"


def test_paddlejob_pod_env_with_the_operators_variables_equals_the_local_backends_env(prod):
    cfg = prod("cluster.backend=paddlejob")
    _, job = _objects(cfg)
    layout = manifests.kubernetes_layout(cfg, "ctr-1a2b3c")
    for role, key in ((Role.SERVER, "ps"), (Role.WORKER, "worker")):
        container = job["spec"][key]["template"]["spec"]["containers"][0]
        for index in range(2):
            # What paddle-operator adds (controllers/paddlejob_helper.go): a ConfigMap as envFrom (pod IPs or
            # names + its port) and, appended to env, POD_IP = the pod name, PADDLE_TRAINER_ID = the index.
            operator_map = {"PADDLE_PORT": "36000", "PADDLE_PSERVERS_IP_PORT_LIST": "from-the-operator",
                            "PADDLE_TRAINERS_NUM": "2", "TRAINER_PORTS_NUM": "20"}
            appended = [{"name": "POD_IP", "value": f"ctr-1a2b3c-{key}-{index}"},
                        {"name": "PADDLE_TRAINER_ID", "value": str(index)},
                        {"name": "TRAINING_ROLE", "value": "PSERVER" if role is Role.SERVER else "TRAINER"}]
            env = _kubelet_env(container["env"], {}, appended, operator_map)
            # The operator exposes no index before the env is built: only PS_ROLE_INDEX (informational) is missing.
            expected = {k: v for k, v in role_env(layout, role, index).items() if k != INDEX_ENV}
            assert {k: env[k] for k in expected} == expected
    assert job["spec"]["intranet"] == "Service"


def test_pod_spec_carries_the_job_and_nothing_secret(prod):
    cfg = prod("ps.epochs=7")
    restore = RestoreTarget("s3://ctr/ckpt", "x", resume=True, shard_num=12)
    _, job = _objects(cfg, restore=restore)
    container = _pod_templates(job)["worker"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    spec = json.loads(env[SPEC_ENV]["value"])
    assert spec["data_dir"] == "s3://ctr/kfp/prepare/dataset" and spec["restore"]["id"] == "x"
    rebuilt = from_dict(spec["config"])
    validate(rebuilt)
    # The config with what the roles must agree on resolved: the restored table's shard count.
    assert to_dict(rebuilt) == to_dict(planned_config(cfg, restore)[0]) and rebuilt.ps.epochs == 7
    assert rebuilt.table.shard_num == 12
    # Credentials only by reference, never a value
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {
        "secretKeyRef": {"name": "ctr-storage", "key": "secret_access_key"}}}
    assert env[RESTART_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == manifests.JOBSET_RESTART_FIELD


def test_pods_are_unprivileged_and_sized_by_role(prod):
    cfg = prod(f"cluster.workers.image.digest={DIGEST}", "+cluster.servers.node_selector.pool=cpu-highmem")
    _, job = _objects(cfg)
    templates = _pod_templates(job)
    for name, template in templates.items():
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
        assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
        (container,) = spec["containers"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    worker = templates["worker"]["spec"]
    server = templates["ps"]["spec"]
    assert worker["containers"][0]["image"] == f"registry.example.com/paddle-ps-pipelines:0.1.0-gpu@{DIGEST}"
    assert server["containers"][0]["image"] == "registry.example.com/paddle-ps-pipelines:0.1.0"
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in server["containers"][0]["resources"]["limits"]
    assert worker["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert server["nodeSelector"] == {"pool": "cpu-highmem"} and "nodeSelector" not in worker
    # Ready once the rendezvous store on server 0 listens: its PS port opens only after the workers joined.
    probe = server["containers"][0]["readinessProbe"]["exec"]["command"]
    assert probe[-1] == "ctr-1a2b3c-ps-0-0.ctr-1a2b3c:36018"


def test_jobset_order_success_restarts_and_ownership(prod):
    cfg = prod("cluster.max_restarts=4")
    policy, job = _objects(cfg)
    spec = job["spec"]
    assert [rj["name"] for rj in spec["replicatedJobs"]] == ["ps", "worker"]  # InOrder: servers first
    assert spec["startupPolicy"] == {"startupPolicyOrder": "InOrder"}
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["worker"]}
    assert spec["failurePolicy"]["maxRestarts"] == 4
    for obj in (policy, job):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == OWNER["uid"] and owner["kind"] == "Pod"


def test_network_policy_admits_tcp_only_between_the_jobs_pods(prod):
    """Every TCP port between the job's pods (gloo's transport listens on ephemeral ports), nothing from others."""
    cfg = prod()
    policy, job = _objects(cfg)
    selector = {manifests.JOB_LABEL: "ctr-1a2b3c"}
    assert policy["spec"]["podSelector"] == {"matchLabels": selector} and policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": selector}}]
    assert rule["ports"] == [{"protocol": "TCP"}]  # a port entry without a port: all ports of that protocol
    for template in _pod_templates(job).values():  # the policy selects every pod of the job
        assert template["metadata"]["labels"][manifests.JOB_LABEL] == "ctr-1a2b3c"
        assert "istio.io/dataplane-mode" not in template["metadata"]["labels"]
    assert len(_objects(prod("cluster.network_policy=false"))) == 1


def test_mesh_encryption_opts_pods_into_istio_ambient_mode(prod):
    policy, job = _objects(prod("cluster.mesh_encryption=true"))
    # Istio ambient tunnels the pods' traffic through port 15008 of the receiving pod: the policy admits it.
    assert policy["spec"]["ingress"][1] == {"ports": [{"protocol": "TCP", "port": 15008}]}
    assert _round_trip(policy, "V1NetworkPolicy") == policy
    for template in _pod_templates(job).values():
        assert template["metadata"]["labels"]["istio.io/dataplane-mode"] == "ambient"
        assert not any(c["name"] == "istio-proxy" for c in template["spec"]["containers"])


def test_paddlejob_restart_attempt_is_a_value_the_launcher_sets(prod):
    _, job = _objects(prod("cluster.backend=paddlejob"), attempt=2)
    env = {e["name"]: e for e in job["spec"]["worker"]["template"]["spec"]["containers"][0]["env"]}
    assert env[RESTART_ENV] == {"name": RESTART_ENV, "value": "2"}


def test_worker0_selector_matches_the_labels_the_controllers_set(prod):
    jobset = manifests.worker0_selector(prod(), "ctr-1a2b3c")
    assert "jobset.sigs.k8s.io/replicatedjob-name=worker" in jobset and "job-index=0" in jobset
    paddle = manifests.worker0_selector(prod("cluster.backend=paddlejob"), "ctr-1a2b3c")
    assert paddle == "paddle-res-name=ctr-1a2b3c-worker-0"


def test_the_readiness_probe_passes_exactly_when_the_store_listens(prod):
    import socket
    import subprocess
    import sys

    cfg = prod()
    (_, job) = _objects(cfg)
    command = _pod_templates(job)["ps"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    with socket.socket() as store:
        store.bind(("127.0.0.1", 0))
        store.listen()
        endpoint = f"127.0.0.1:{store.getsockname()[1]}"
        probe = [sys.executable, *command[1:-1], endpoint]
        assert subprocess.run(probe, cwd=ROOT).returncode == 0
    assert subprocess.run(probe, cwd=ROOT).returncode != 0
