"""The Kubernetes objects of a PS job, checked offline: against the Kubernetes client's models, the Trainer, JobSet
and PaddleJob CRD schemas (../shared/schemas), Trainer's webhook rules and what Trainer, the Job controller and
JobSet make of the objects (:mod:`tests.train.backends.kube_controllers`), and against the env the local backend
gives the same roles."""

import base64
import copy
import hashlib
import json
from pathlib import Path

import jsonschema
import pytest
from cryptography import x509
from kubernetes.client import ApiClient

from components.checkpoint.restore import RestoreTarget
from components.checkpoint.store import CheckpointStore
from components.config import ConfigError, from_dict, to_dict
from components.config_rules import validate
from components.ps.contract import CONFIG_ERROR_EXIT, INDEX_ENV, RESTART_ENV, SPEC_ENV, Role, role_env
from components.ps import brpc_tls, tls
from components.train.backends import manifests, pod_tls, rbac
from components.train.backends.kubernetes.cleanup import RUN_OBJECT_KINDS
from components.train.job import PreparedJob
from components.train.planner import job_plan
from tests.conftest import ROOT, needs_schemas
from tests.train.backends.crds import crd_schema
from tests.train.backends.kube_controllers import (job_failure, job_pod, jobset_action, kubelet_env, selects,
                                                   training_runtime_errors, trainjob_jobset)

DIGEST = "sha256:" + "ab" * 32
OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "ctr-run-train-abc", "uid": "1b2c3d4e-0000-1111-2222-333344445555"}
# What a pod gets besides the Paddle environment of its role.
EXTRA_ENV = {RESTART_ENV, SPEC_ENV, "HOME", "PYTHONUNBUFFERED", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
BACKENDS = ["trainjob", "jobset", "paddlejob"]
JOBSET_BACKENDS = ["trainjob", "jobset"]  # a JobSet runs the job: the launcher's own, or the one Trainer builds


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
    return PreparedJob(cfg, CheckpointStore("memory://manifests"), restore, job_plan(cfg, restore=restore))


def _objects(cfg, restore=None):
    return manifests.job_manifests(_prepared(cfg, restore), name="ctr-1a2b3c", namespace="team-a",
                                   data_uri="s3://ctr/kfp/prepare/dataset", owner=OWNER)


def _round_trip(obj: dict, model: str) -> dict:
    """``obj`` through the Kubernetes client's model and back: a misspelt or misplaced field is dropped
    (deserialize ignores unknown keys), so comparing with the input finds it; required fields are checked."""
    client = ApiClient()
    response = type("Response", (), {"data": json.dumps(obj)})()
    return client.sanitize_for_serialization(client.deserialize(response, model))


def _running(objects: list[dict]) -> dict:
    """What runs the job: the JobSet, the JobSet Trainer builds from the TrainingRuntime and TrainJob, the PaddleJob."""
    if objects[-1]["kind"] == "TrainJob":
        return trainjob_jobset(objects[-2], objects[-1])
    return objects[-1]


def _replicated_jobs(jobset):
    return {rj["name"]: rj for rj in jobset["spec"]["replicatedJobs"]}


def _pod_templates(obj):
    """Pod templates by role (``ps``, ``worker``) of what runs the job."""
    if obj["kind"] == "JobSet":
        templates = {name: rj["template"]["spec"]["template"] for name, rj in _replicated_jobs(obj).items()}
        return {"ps": templates["ps"], "worker": templates.get("worker") or templates["node"]}
    return {key: obj["spec"][key]["template"] for key in ("ps", "worker")}


def _index_fields(backend: str, index: int, jobset: str = "ctr-1a2b3c") -> dict:
    """The downward-API fields a pod of index ``index`` of the JobSet ``jobset`` reads."""
    field = manifests.COMPLETION_INDEX_FIELD if backend == "trainjob" else manifests.JOBSET_INDEX_FIELD
    return {field: str(index), manifests.JOBSET_RESTART_FIELD: "0", manifests.JOBSET_NAME_FIELD: jobset}


@pytest.mark.parametrize("backend", BACKENDS)
def test_objects_fit_the_kubernetes_models(prod, backend):
    cfg = prod(f"cluster.backend={backend}")
    policy, *jobs = _objects(cfg)
    assert _round_trip(policy, "V1NetworkPolicy") == policy
    running = _running(jobs)
    for template in _pod_templates(running).values():
        assert _round_trip(template, "V1PodTemplateSpec") == template
    if running["kind"] == "JobSet":  # each replicated job's Job, its podFailurePolicy included
        for rjob in running["spec"]["replicatedJobs"]:
            assert _round_trip(rjob["template"]["spec"], "V1JobSpec") == rjob["template"]["spec"]
    if backend == "trainjob":
        trainer = jobs[-1]["spec"]["trainer"]
        assert _round_trip(trainer["resourcesPerNode"], "V1ResourceRequirements") == trainer["resourcesPerNode"]
        assert [_round_trip(e, "V1EnvVar") for e in trainer["env"]] == trainer["env"]
    for obj in rbac.launcher_rbac(cfg):
        assert _round_trip(obj, f"V1{obj['kind']}") == obj


@needs_schemas
@pytest.mark.parametrize("backend", BACKENDS)
def test_objects_fit_the_crd_schemas(prod, backend):
    _, *jobs = _objects(prod(f"cluster.backend={backend}"))
    for job in jobs + ([_running(jobs)] if backend == "trainjob" else []):  # and the JobSet Trainer makes
        jsonschema.validate(job, crd_schema(job["kind"]))
    job = jobs[0]
    with pytest.raises(jsonschema.ValidationError):  # the schema is strict enough to catch a wrong type
        broken = copy.deepcopy(job)
        replicated = (broken["spec"]["template"]["spec"] if job["kind"] == "TrainingRuntime" else broken["spec"])
        (replicated["replicatedJobs"][0] if "replicatedJobs" in replicated else replicated["ps"])["replicas"] = "two"
        jsonschema.validate(broken, crd_schema(job["kind"]))


def test_training_runtime_passes_trainers_webhook_and_trainer_patches_only_the_node_job(prod):
    cfg = prod("cluster.backend=trainjob", "ps.servers=3", "ps.workers=4", "cluster.workers.cpu=6")
    _, runtime, trainjob = _objects(cfg)
    assert training_runtime_errors(runtime) == []
    # What the kubeflow SDK and Trainer 2.4 need: the framework label, short replicated-job and host names.
    assert runtime["metadata"]["labels"][manifests.TRAINER_FRAMEWORK_LABEL] == manifests.TRAINER_FRAMEWORK
    name = runtime["metadata"]["name"]
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        assert len(rjob["name"]) <= manifests.MAX_REPLICATED_JOB_NAME
    hosts = [manifests.pod_host(cfg, f"{name}-r9", role, 999).split(".")[0] for role in Role]  # a relaunch's name
    assert max(map(len, hosts)) <= manifests.MAX_HOST_NAME
    rjobs = _replicated_jobs(runtime["spec"]["template"])
    assert list(rjobs) == ["ps", "node"]  # servers first (InOrder)
    assert rjobs["node"]["replicas"] == 1 and rjobs["node"]["template"]["metadata"]["labels"] == {
        manifests.TRAINER_ANCESTOR_LABEL: manifests.TRAINER_ANCESTOR}
    assert [c["name"] for c in rjobs["node"]["template"]["spec"]["template"]["spec"]["containers"]] == ["node"]
    # Trainer gives every container named node the TrainJob's env and resources: the servers' is not one.
    assert [c["name"] for c in rjobs["ps"]["template"]["spec"]["template"]["spec"]["containers"]] == ["server"]
    assert "metadata" not in rjobs["ps"]["template"]
    assert trainjob["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                              "name": runtime["metadata"]["name"]}
    assert trainjob["spec"]["trainer"]["numNodes"] == 4
    assert trainjob["spec"]["trainer"]["resourcesPerNode"]["requests"] == {"cpu": "6", "memory": "32Gi"}

    built = _replicated_jobs(trainjob_jobset(runtime, trainjob))
    assert (built["node"]["replicas"], built["node"]["template"]["spec"]["parallelism"]) == (1, 4)
    assert (built["ps"]["replicas"], built["ps"]["template"]["spec"]["parallelism"]) == (1, 3)
    server = built["ps"]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert server["resources"]["requests"] == {"cpu": "8", "memory": "32Gi"}
    assert {e["name"]: e.get("value") for e in server["env"]}["TRAINING_ROLE"] == "PSERVER"

    # The webhook's rules, as the checker applies them, refuse what they should.
    for breaks in (lambda rj: rj.update(replicas=2),
                   lambda rj: rj["template"]["spec"]["template"]["spec"]["containers"][0].update(name="worker")):
        broken = copy.deepcopy(runtime)
        breaks(broken["spec"]["template"]["spec"]["replicatedJobs"][1])
        assert len(training_runtime_errors(broken)) == 1


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
@pytest.mark.parametrize("servers,workers", [(2, 2), (3, 1)])
def test_jobset_pod_env_equals_the_local_backends_env(prod, backend, servers, workers):
    cfg = prod(f"cluster.backend={backend}", f"ps.servers={servers}", f"ps.workers={workers}")
    running = _running(_objects(cfg)[1:])
    layout = manifests.kubernetes_layout(cfg, "ctr-1a2b3c")
    templates = _pod_templates(running)
    for role, count in ((Role.SERVER, servers), (Role.WORKER, workers)):
        container = templates[REPLICATED_ROLE[role]]["spec"]["containers"][0]
        for index in range(count):
            env = kubelet_env(container["env"], _index_fields(backend, index))
            expected = role_env(layout, role, index)
            assert {k: env[k] for k in expected} == expected
            # and a TrainJob's pod the name of its JobSet, which its hosts are named after
            named = {manifests.JOB_NAME_ENV} if backend == "trainjob" else set()
            assert set(env) - set(expected) == EXTRA_ENV | named
    # The endpoints are the pods' stable DNS names: <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>;
    # Trainer's replicated jobs are one Job each, whose pod index is the role index.
    if backend == "trainjob":
        assert layout.server_endpoints == tuple(f"ctr-1a2b3c-ps-0-{i}.ctr-1a2b3c:36000" for i in range(servers))
        assert layout.worker_endpoints == tuple(f"ctr-1a2b3c-node-0-{i}.ctr-1a2b3c:36000" for i in range(workers))
    else:
        assert layout.server_endpoints == tuple(f"ctr-1a2b3c-ps-{i}-0.ctr-1a2b3c:36000" for i in range(servers))
    assert layout.gloo_endpoint == f"{layout.server_endpoints[0].rsplit(':', 1)[0]}:36018"
    # A TrainJob's runtime names no subdomain: JobSet's default is the JobSet's name, whatever TrainJob made it.
    network = running["spec"]["network"]
    assert network.get("subdomain", running["metadata"]["name"]) == running["metadata"]["name"] == "ctr-1a2b3c"
    assert ("subdomain" in network) == (backend == "jobset")


REPLICATED_ROLE = {Role.SERVER: "ps", Role.WORKER: "worker"}  # _pod_templates' keys


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
            env = kubelet_env(container["env"], {}, appended, operator_map)
            # The operator exposes no index before the env is built: only PS_ROLE_INDEX (informational) is missing.
            expected = {k: v for k, v in role_env(layout, role, index).items() if k != INDEX_ENV}
            assert {k: env[k] for k in expected} == expected
    assert job["spec"]["intranet"] == "Service"


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_pod_spec_carries_the_job_and_nothing_secret(prod, backend):
    cfg = prod(f"cluster.backend={backend}", "ps.epochs=7")
    restore = RestoreTarget("s3://ctr/ckpt", "x", resume=True, shard_num=12)
    container = _pod_templates(_running(_objects(cfg, restore=restore)[1:]))["worker"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    spec = json.loads(env[SPEC_ENV]["value"])
    assert spec["data_dir"] == "s3://ctr/kfp/prepare/dataset" and spec["restore"]["id"] == "x"
    rebuilt = from_dict(spec["config"])
    validate(rebuilt)
    # The user's config as written, and beside it what the roles must agree on: the restored table's shard count.
    assert to_dict(rebuilt) == to_dict(cfg) and rebuilt.ps.epochs == 7 and rebuilt.table.shard_num is None
    assert spec["plan"]["shard_num"] == 12 and spec["plan"]["shard_source"] == "as saved in checkpoint x"
    # Credentials only by reference, never a value
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {
        "secretKeyRef": {"name": "ctr-storage", "key": "secret_access_key"}}}
    assert env[RESTART_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == manifests.JOBSET_RESTART_FIELD


@pytest.mark.parametrize("backend", BACKENDS)
def test_pods_are_unprivileged_and_sized_by_role(prod, backend):
    cfg = prod(f"cluster.backend={backend}", f"cluster.workers.image.digest={DIGEST}",
               "+cluster.servers.node_selector.pool=cpu-highmem")
    templates = _pod_templates(_running(_objects(cfg)[1:]))
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
    assert "cpu" not in server["containers"][0]["resources"]["limits"]  # unless cluster.servers.cpu_limit
    assert worker["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert server["nodeSelector"] == {"pool": "cpu-highmem"} and "nodeSelector" not in worker
    env = kubelet_env(server["containers"][0]["env"], _index_fields(backend, 1))
    assert env[manifests.GLOO_ENDPOINT_ENV] == manifests.kubernetes_layout(cfg, "ctr-1a2b3c").gloo_endpoint


@pytest.mark.parametrize("tls", ["on", "off"])
def test_the_readiness_probe_asks_the_store_itself(prod, tls):
    """Ready once the rendezvous store on server 0 listens: its PS port opens only after the workers joined. The
    probe reads the store's address from the env the kubelet expanded ($(VAR) is not expanded in a probe); behind
    a terminator (which accepts before the store listens) it asks the store's loopback port."""
    server = _pod_templates(_running(_objects(prod(f"ps.tls={tls}"))[1:]))["ps"]["spec"]
    probe = server["containers"][0]["readinessProbe"]["exec"]["command"]
    store = "127.0.0.1:36118" if tls == "on" else f'"${manifests.GLOO_ENDPOINT_ENV}"'
    assert probe[:2] == ["sh", "-c"] and probe[2].endswith(f"ready {store}")


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_with_tls_each_role_gets_brpcs_tls_and_its_store_terminator_with_its_roles_secret(prod, backend, tmp_path):
    cfg = prod(f"cluster.backend={backend}")  # ps.tls=auto: on, without cluster.mesh_encryption
    library = tmp_path / "libbrpc_tls.so"
    library.touch()
    templates = _pod_templates(_running(_objects(cfg)[1:]))
    hosts = manifests.kubernetes_layout(cfg, "ctr-1a2b3c")
    for key, role in (("ps", Role.SERVER), ("worker", Role.WORKER)):
        spec = templates[key]["spec"]
        (container,) = spec["containers"]
        assert container["command"] == ["python", "-m", "components.ps.tls", "--",
                                        "python", "-m", "components.ps.role"]
        assert {"name": "tls", "mountPath": tls.TLS_DIR, "readOnly": True} in container["volumeMounts"]
        assert {"name": "tls", "secret": {"secretName": f"ctr-1a2b3c-tls-{role.value}", "defaultMode": 0o440}} \
            in spec["volumes"]
        # What index 1 makes of the pod's env (the image's brpc TLS library stood in for): its own certificate for
        # brpc and the terminator, server 0's store dialled by its pod name, its own pod's address kept.
        env = {**kubelet_env(container["env"], _index_fields(backend, 1)), brpc_tls.LIBRARY_ENV: str(library)}
        role_plan = tls.plan(env, resolve=lambda host: host)
        conf, role_env_ = role_plan.conf, role_plan.env
        assert f"ssl crt {tls.TLS_DIR}/{role.value}-1.pem" in conf and f" {hosts.gloo_endpoint} ssl" in conf
        assert role_env_[brpc_tls.PEM_ENV] == f"{tls.TLS_DIR}/{role.value}-1.pem"
        assert role_env_["LD_PRELOAD"] == str(library)
        assert role_env_["POD_IP"] == hosts.endpoint(role, 1).rsplit(":", 1)[0]
    # The Secrets the launcher makes: each index's certificate names the host its peers dial it by.
    owner = {"apiVersion": "x/v1", "kind": "JobSet", "name": "ctr-1a2b3c", "uid": "u-1"}
    secrets = pod_tls.job_secrets(hosts, "team-a", {manifests.JOB_LABEL: "ctr-1a2b3c"}, owner)
    assert [s["metadata"]["name"] for s in secrets] == ["ctr-1a2b3c-tls-server", "ctr-1a2b3c-tls-worker"]
    for secret, role in zip(secrets, (Role.SERVER, Role.WORKER)):
        assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        count = cfg.ps.servers if role is Role.SERVER else cfg.ps.workers
        assert set(secret["data"]) == {tls.CA_FILE} | {f"{role.value}-{i}.pem" for i in range(count)}
        for i in range(count):
            cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"][f"{role.value}-{i}.pem"]))
            names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert hosts.endpoint(role, i).rsplit(":", 1)[0] in names.get_values_for_type(x509.DNSName)


def test_paddlejob_pods_carry_no_terminator(prod):
    templates = _pod_templates(_objects(prod("cluster.backend=paddlejob"))[-1])
    assert all(t["spec"]["containers"][0]["command"] == ["python", "-m", "components.ps.role"]
               for t in templates.values())


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
def test_jobset_order_success_restarts_and_ownership(prod, backend):
    cfg = prod(f"cluster.backend={backend}", "cluster.max_restarts=4")
    policy, *jobs = _objects(cfg)
    spec = _running(jobs)["spec"]
    workers = "node" if backend == "trainjob" else "worker"
    assert [rj["name"] for rj in spec["replicatedJobs"]] == ["ps", workers]  # InOrder: servers first
    assert spec["startupPolicy"] == {"startupPolicyOrder": "InOrder"}
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": [workers]}
    assert spec["failurePolicy"]["maxRestarts"] == 4
    for obj in (policy, *jobs):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == OWNER["uid"] and owner["kind"] == "Pod"


@pytest.mark.parametrize("backend", JOBSET_BACKENDS)
@pytest.mark.parametrize("role", ["ps", "worker"])
def test_a_configuration_error_fails_the_job_and_a_disruption_restarts_it_without_counting(prod, backend, role):
    """What the Job controller and JobSet make of a pod's failure, by these manifests' policies."""
    running = _running(_objects(prod(f"cluster.backend={backend}"))[1:])
    rjob = _replicated_jobs(running)["node" if (backend, role) == ("trainjob", "worker") else role]
    job = rjob["template"]["spec"]
    container = job["template"]["spec"]["containers"][0]["name"]

    def action(exit_code, *conditions):
        reason, message = job_failure(job, "team-a", f"{rjob['name']}-0-x", container, exit_code, conditions)
        return jobset_action(running["spec"]["failurePolicy"], rjob["name"], reason, message)

    assert action(CONFIG_ERROR_EXIT) == ("FailJobSet", "ConfigurationError")
    assert action(143, "DisruptionTarget") == ("RestartJobSetAndIgnoreMaxRestarts", "Disrupted")
    assert action(1) == ("RestartJobSet", None)  # counts towards maxRestarts
    assert action(137) == ("RestartJobSet", None)  # e.g. OOM-killed: a restart may get past it
    assert job["backoffLimit"] == 0 and job["template"]["spec"]["restartPolicy"] == "Never"


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


@pytest.mark.parametrize("backend", BACKENDS)
def test_network_policy_lets_the_jobs_pods_reach_each_other_dns_and_the_store_only(prod, backend):
    """Both directions: TCP on any port between the job's pods (gloo's transport listens on ephemeral ports), UDP and
    TCP 53 to the cluster DNS, the store (cluster.store_egress for an s3:// one) without the metadata address; the
    pods selected by the labels their controller sets."""
    policy, *job = _objects(prod(f"cluster.backend={backend}"))
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    peers = [{"podSelector": spec["podSelector"]}]
    if backend != "paddlejob":  # JobSet's own label (a TrainJob's JobSet has its name): not one the template sets
        assert spec["podSelector"] == {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "ctr-1a2b3c"}}
    assert spec["ingress"] == [{"from": peers, "ports": [{"protocol": "TCP"}]}]
    to_pods, dns, store = spec["egress"]
    assert to_pods == {"to": peers, "ports": [{"protocol": "TCP"}]}
    assert dns == {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                           "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                   "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    assert store == {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}}]}
    runtime = job[0] if backend == "trainjob" else None
    for role in ("ps", "worker"):  # every pod of the job, as its controller labels it, is selected
        _, labels, _ = job_pod(job[-1], role, 0, runtime)
        assert _matches(spec["podSelector"], labels)
        assert "istio.io/dataplane-mode" not in labels
    assert _round_trip(policy, "V1NetworkPolicy") == policy
    assert len(_objects(prod(f"cluster.backend={backend}", "cluster.network_policy=false"))) == len(job)


def test_a_store_named_by_its_address_is_the_only_store_the_pods_reach(prod):
    cfg = prod("checkpoint.uri=http://10.1.2.3:9000/ckpt", "cluster.store_egress=[10.0.0.0/8,169.254.0.0/16]")
    policy = manifests.job_manifests(_prepared(cfg), name="ctr-1a2b3c", namespace="team-a",
                                     data_uri="https://10.1.2.4/dataset")[0]
    assert policy["spec"]["egress"][2:] == [
        {"to": [{"ipBlock": {"cidr": "10.1.2.4/32"}}], "ports": [{"protocol": "TCP", "port": 443}]},
        {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}], "ports": [{"protocol": "TCP", "port": 9000}]}]
    # A bucket names no address: cluster.store_egress, the metadata address cut out of any range that holds it.
    policy, _ = _objects(cfg)
    assert policy["spec"]["egress"][2:] == [
        {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}], "ports": [{"protocol": "TCP", "port": 9000}]},
        {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}},
                {"ipBlock": {"cidr": "169.254.0.0/16", "except": ["169.254.169.254/32"]}}]}]
    # None listed: no rule (an egress rule without "to" would admit every address).
    policy, _ = _objects(prod("cluster.store_egress=[]"))
    assert len(policy["spec"]["egress"]) == 2
    with pytest.raises(ConfigError, match=r"'cluster.store_egress\[0\]' has value '10.0.0.1/8'; allowed: a CIDR"):
        prod("cluster.store_egress=[10.0.0.1/8]")


@pytest.mark.parametrize("backend", BACKENDS)
def test_pods_opt_out_of_sidecars_unless_mesh_encryption_puts_them_in_ambient_mode(prod, backend):
    for template in _pod_templates(_running(_objects(prod(f"cluster.backend={backend}"))[1:])).values():
        labels = template["metadata"]["labels"]
        assert labels[manifests.SIDECAR_INJECT_LABEL] == "false" and "istio.io/dataplane-mode" not in labels
    meshed = _running(_objects(prod(f"cluster.backend={backend}", "cluster.mesh_encryption=true"))[1:])
    for template in _pod_templates(meshed).values():
        labels = template["metadata"]["labels"]
        assert labels["istio.io/dataplane-mode"] == "ambient" and manifests.SIDECAR_INJECT_LABEL not in labels
        assert not any(c["name"] == "istio-proxy" for c in template["spec"]["containers"])


def test_mesh_encryption_admits_the_ambient_tunnel_port(prod):
    policy, _ = _objects(prod("cluster.mesh_encryption=true"))
    # Istio ambient tunnels the pods' traffic through port 15008 of the receiving pod: the policy admits it (and
    # egress to the job's pods admits every TCP port, that one included).
    assert policy["spec"]["ingress"][1] == {"ports": [{"protocol": "TCP", "port": 15008}]}
    assert _round_trip(policy, "V1NetworkPolicy") == policy


@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_user_namespaces_pull_secrets_cpu_limits_and_a_kueue_queue(prod, backend):
    queue = [] if backend == "paddlejob" else ["cluster.queue_name=team-a-queue"]
    policy, *jobs = _objects(prod(f"cluster.backend={backend}", "cluster.image_pull_secrets=[regcred,mirror]",
                                  "cluster.servers.cpu_limit=8", *queue))
    for role, template in _pod_templates(_running(jobs)).items():
        assert template["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
        limits = template["spec"]["containers"][0]["resources"]["limits"]
        assert limits.get("cpu") == ("8" if role == "ps" else None)
    queued = [obj["kind"] for obj in (policy, *jobs)
              if obj["metadata"]["labels"].get(manifests.KUEUE_QUEUE_LABEL) == "team-a-queue"]
    assert queued == {"trainjob": ["TrainJob"], "jobset": ["JobSet"], "paddlejob": []}[backend]


def test_kueue_cannot_queue_a_paddlejob(prod):
    with pytest.raises(ConfigError) as err:
        prod("cluster.backend=paddlejob", "cluster.queue_name=team-a-queue")
    assert err.value.key == "cluster.queue_name"


def test_a_paddlejob_resumes_from_what_its_spec_names_and_a_jobset_from_its_restart_attempt(prod):
    """A PaddleJob is recreated by the launcher with the checkpoint it chose in the roles' spec: the pods have no
    restart attempt to choose again from; a JobSet's pods read theirs from the annotation JobSet sets."""
    _, job = _objects(prod("cluster.backend=paddlejob"))
    env = {e["name"]: e for e in job["spec"]["worker"]["template"]["spec"]["containers"][0]["env"]}
    assert RESTART_ENV not in env and SPEC_ENV in env
    _, jobset = _objects(prod("cluster.backend=jobset"))
    template = jobset["spec"]["replicatedJobs"][-1]["template"]["spec"]["template"]
    env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
    assert env[RESTART_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == manifests.JOBSET_RESTART_FIELD


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("role,index", [(Role.WORKER, 0), (Role.SERVER, 1)])
def test_role_pod_selectors_select_the_pod_the_controllers_label(prod, backend, role, index):
    cfg = prod(f"cluster.backend={backend}", "ps.servers=2", "ps.workers=2")
    _, *jobs = _objects(cfg)
    runtime = jobs[0] if backend == "trainjob" else None
    pods = {(r, i): job_pod(jobs[-1], r, i, runtime)[1] for r in ("ps", "worker") for i in range(2)}
    wanted = ("ps" if role is Role.SERVER else "worker", index)
    selected = [key for key, labels in pods.items()
                if selects(manifests.role_pod_selector(cfg, "ctr-1a2b3c", role, index), labels)]
    assert selected == [wanted]
    if backend == "paddlejob":  # the operator labels each pod apart: no selector of a whole role
        with pytest.raises(ValueError, match="name its index"):
            manifests.role_pod_selector(cfg, "ctr-1a2b3c", role)
    else:
        every = manifests.role_pod_selector(cfg, "ctr-1a2b3c", role)
        assert sorted(key for key, labels in pods.items() if selects(every, labels)) == [(wanted[0], 0), (wanted[0], 1)]


def test_the_readiness_probe_passes_exactly_when_the_store_listens(prod):
    import socket
    import subprocess
    import sys

    cfg = prod("ps.tls=off")
    (_, job) = _objects(cfg)
    command = _pod_templates(job)["ps"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    with socket.socket() as store:
        store.bind(("127.0.0.1", 0))
        store.listen()
        # The command as the kubelet runs it, in a container whose env holds the store's address and whose python
        # is this one.
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
               manifests.GLOO_ENDPOINT_ENV: f"127.0.0.1:{store.getsockname()[1]}"}
        assert subprocess.run(command, cwd=ROOT, env=env).returncode == 0
    assert subprocess.run(command, cwd=ROOT, env=env).returncode != 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_rbac_grants_the_launcher_the_kinds_of_its_backend_only(prod, backend):
    cfg = prod(f"cluster.backend={backend}")
    account, role, binding, token_role, token_binding, _, _ = rbac.launcher_rbac(cfg)
    assert (account["kind"], account["metadata"]["name"]) == ("ServiceAccount", "ctr-ps-launcher")
    # No token Secret: the run's account may request short-lived tokens of the launcher account, of no other.
    assert token_role["rules"] == [{"apiGroups": [""], "resources": ["serviceaccounts/token"],
                                    "resourceNames": ["ctr-ps-launcher"], "verbs": ["create"]}]
    assert token_binding["subjects"] == [{"kind": "ServiceAccount", "name": "default-editor", "namespace": "kubeflow"}]
    assert token_binding["roleRef"]["name"] == token_role["metadata"]["name"]
    granted = {(group, resource) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"]}
    kinds = {obj["kind"] for obj in _objects(cfg)}
    plural = {f"{kind.lower()}s" for kind in kinds}
    assert plural - {"networkpolicys"} <= {resource for _, resource in granted}  # every kind it creates
    jobs = {"jobsets", "paddlejobs", "trainjobs", "trainingruntimes"}
    assert {resource for _, resource in granted} & jobs == plural & jobs  # and no other backend's
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ctr-ps-launcher", "namespace": "kubeflow"}]
    # The exit handler lists and deletes every kind the run's clean-up looks for.
    may = {(group, resource): set(rule["verbs"]) for rule in role["rules"] for group in rule["apiGroups"]
           for resource in rule["resources"]}
    plurals = {"NetworkPolicy": "networkpolicies"}
    for api_version, kind in RUN_OBJECT_KINDS[cfg.cluster.backend]:
        resource = (api_version.split("/")[0], plurals.get(kind, f"{kind.lower()}s"))
        assert {"list", "delete"} <= may[resource], resource
    # The job's TLS Secrets: created, never read (a Secret read is every Secret of the namespace) nor deleted (the
    # job owns them); none without a terminator in the pods.
    assert may.get(("", "secrets")) == (None if backend == "paddlejob" else {"create"})
    policy = rbac.launcher_policy(cfg)[0]["spec"]["matchConstraints"]["resourceRules"]
    assert ({"apiGroups": [""], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["secrets"]} in policy) \
        is (backend != "paddlejob")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("deploy", [False, True])
def test_the_launcher_role_has_no_unscoped_verb(prod, backend, deploy):
    """Each verb is limited to names (resourceNames), or a delete limited by the admission policy to objects
    labelled as a PS job's, or one Kubernetes cannot limit (create: no name yet; reads: names made per run)."""
    cfg = prod(f"cluster.backend={backend}", f"cluster.serving.deploy={str(deploy).lower()}")
    documents = rbac.launcher_rbac(cfg)
    objects = {obj["kind"]: obj for obj in documents if obj["metadata"]["name"] != rbac.TOKEN_ROLE_NAME}
    policy, binding = objects["ValidatingAdmissionPolicy"], objects["ValidatingAdmissionPolicyBinding"]
    guarded = {(group, resource) for rule in policy["spec"]["matchConstraints"]["resourceRules"]
               if {"CREATE", "DELETE"} <= set(rule["operations"])
               for group in rule["apiGroups"] for resource in rule["resources"]}
    for rule in [rule for obj in documents if obj["kind"] == "Role" for rule in obj["rules"]]:
        if rule.get("resourceNames"):
            continue
        for verb in set(rule["verbs"]) - rbac.UNNAMED_VERBS:
            assert verb == "delete", rule  # no update, patch, deletecollection, escalate, bind, impersonate, "*"
            assert {(g, r) for g in rule["apiGroups"] for r in rule["resources"]} <= guarded, rule
    assert "*" not in {v for obj in documents if obj["kind"] == "Role" for rule in obj["rules"] for v in rule["verbs"]}
    # The policy acts on the launcher account's requests, in its namespace, and denies.
    account = f"system:serviceaccount:kubeflow:{cfg.cluster.service_account}"
    assert policy["spec"]["matchConditions"] == [
        {"name": "the-launcher-account", "expression": f"request.userInfo.username == '{account}'"}]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "kubeflow"}
    (validation,) = policy["spec"]["validations"]
    assert f"'{manifests.JOB_LABEL}' in variables.obj.metadata.labels" in validation["expression"]
    # Every object the launcher creates carries that label: the policy admits its own objects.
    assert all(manifests.JOB_LABEL in obj["metadata"]["labels"] for obj in _objects(cfg))


@pytest.mark.parametrize("backend", BACKENDS)
def test_review_manifests_are_the_objects_of_a_run_without_its_own_names(prod, backend):
    cfg = prod(f"cluster.backend={backend}", "cluster.namespace=team-a")
    review = manifests.review_manifests(cfg, "s3://ctr/kfp/<run>/dataset")
    run = _objects(cfg)
    assert [obj["kind"] for obj in review] == [obj["kind"] for obj in run]
    for obj in review:
        assert obj["metadata"]["namespace"] == "team-a" and "ownerReferences" not in obj["metadata"]
        assert obj["metadata"]["name"].startswith(manifests.REVIEW_NAME)
    worker = _pod_templates(_running(review[1:]))["worker"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert json.loads(env[SPEC_ENV])["data_dir"] == "s3://ctr/kfp/<run>/dataset"
    if backend == "trainjob":
        assert training_runtime_errors(review[1]) == []


RUN_NAME_60 = "ctr-ps-training-daily-criteo-terabyte-sweep-lr-0-05-x7k2pq9z"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_long_run_name_is_cut_with_a_hash_so_every_host_name_fits(prod, backend):
    assert len(RUN_NAME_60) == 60
    cfg = prod(f"cluster.backend={backend}", "ps.servers=12", "ps.workers=128", "cluster.max_restarts=10")
    name = manifests.job_name(cfg, RUN_NAME_60, "3f9a1c2b")
    digest = hashlib.sha256(RUN_NAME_60.encode()).hexdigest()[:manifests.RUN_NAME_HASH]
    assert name.startswith("ctr-ps-training-") and name.endswith(f"-{digest}-3f9a1c2b")
    # Another run whose name begins alike gets another name; a short one keeps its name whole.
    assert manifests.job_name(cfg, RUN_NAME_60[:-1] + "y", "3f9a1c2b") != name
    assert manifests.job_name(cfg, "ctr-ps-training-x7k2p", "3f9a1c2b") == "ctr-ps-training-x7k2p-3f9a1c2b"
    assert manifests.job_name(cfg, None, "3f9a1c2b") == manifests.job_name(cfg, "", "3f9a1c2b") == "ctr-ps-3f9a1c2b"
    assert manifests.job_name(cfg, "2026 Run #7", "3f9a1c2b") == "ctr-ps-2026-run-7-3f9a1c2b"  # a DNS label
    # The longest host name of the objects made with it (a relaunch's, the last index) fits; so do the
    # replicated-job names Trainer 2.4 limits.
    relaunched = f"{name}-r{cfg.cluster.max_restarts}"
    _, *jobs = manifests.job_manifests(_prepared(cfg), name=relaunched, namespace="team-a",
                                       data_uri="s3://ctr/kfp/prepare/dataset")
    running = _running(jobs)
    kubelet = {manifests.JOBSET_NAME_FIELD: relaunched, manifests.JOBSET_RESTART_FIELD: "0",
               manifests.COMPLETION_INDEX_FIELD: "127", manifests.JOBSET_INDEX_FIELD: "127"}
    hosts = []
    for template in _pod_templates(running).values():
        env = kubelet_env(template["spec"]["containers"][0]["env"], kubelet)
        hosts += [endpoint.rsplit(":", 1)[0].split(".")[0] for key in ("PADDLE_PSERVERS_IP_PORT_LIST",
                                                                       "PADDLE_TRAINER_ENDPOINTS")
                  for endpoint in env[key].split(",")]
    assert max(map(len, hosts)) <= manifests.MAX_HOST_NAME and len(hosts) == 2 * (12 + 128)
    (last,) = {f"{relaunched}-worker-127-0", f"{relaunched}-node-0-127", f"{relaunched}-worker-127"} & set(hosts)
    assert len(last) == max(map(len, hosts))  # the last worker's, as job_name reckons
    if running.get("kind") == "JobSet":
        assert all(len(rjob["name"]) <= manifests.MAX_REPLICATED_JOB_NAME for rjob in running["spec"]["replicatedJobs"])
