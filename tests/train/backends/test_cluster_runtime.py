"""The ClusterTrainingRuntime (``k8s/cluster-training-runtime.yaml``): the checked-in file is what its command
generates, it fits the CRD of ../shared/schemas and Trainer's webhook rules, and a TrainJob of any name, carrying
nothing but a runtime reference (as the kubeflow SDK makes one), gets pods whose env is the local backend's for
hosts named after that TrainJob."""

import jsonschema
import pytest
import yaml

from components.ps.contract import Role, role_env
from components.train.backends import cluster_runtime, manifests
from tests.conftest import ROOT, needs_schemas
from tests.train.backends.crds import crd_schema
from tests.train.backends.kube_controllers import kubelet_env, training_runtime_errors, trainjob_jobset

SDK_NAME = "k3x9f2a1b0c4"  # a name as TrainerClient().train() draws one: a letter + 11 hex digits


@pytest.fixture(scope="module")
def runtime() -> dict:
    return yaml.safe_load((ROOT / cluster_runtime.CHECKED_IN).read_text())


def test_the_checked_in_runtime_is_what_its_command_generates(runtime):
    text = cluster_runtime.generate(list(cluster_runtime.DEFAULT_OVERRIDES), cluster_runtime.DEFAULT_DATA_URI,
                                    cluster_runtime.CHECKED_IN, cluster_runtime.DEFAULT_BASELINE_URI)
    assert (ROOT / cluster_runtime.CHECKED_IN).read_text() == text, \
        f"{cluster_runtime.CHECKED_IN} is stale: regenerate it with `{cluster_runtime.REGENERATE}`"
    assert runtime["kind"] == "ClusterTrainingRuntime" and "namespace" not in runtime["metadata"]
    assert runtime["metadata"]["labels"][manifests.TRAINER_FRAMEWORK_LABEL] == manifests.TRAINER_FRAMEWORK
    assert training_runtime_errors(runtime) == []
    assert all(len(rjob["name"]) <= manifests.MAX_REPLICATED_JOB_NAME
               for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"])


@needs_schemas
def test_the_runtime_fits_the_cluster_training_runtime_crd(runtime):
    jsonschema.validate(runtime, crd_schema("ClusterTrainingRuntime"))


def test_a_trainjob_of_any_name_runs_on_it_with_the_local_backends_env(runtime):
    sdk_job = {"apiVersion": manifests.TRAINER_API, "kind": "TrainJob",
               "metadata": {"name": SDK_NAME, "namespace": "team-a"},
               "spec": {"runtimeRef": {"apiGroup": manifests.TRAINER_GROUP, "kind": "ClusterTrainingRuntime",
                                       "name": runtime["metadata"]["name"]}}}
    jobset = trainjob_jobset(runtime, sdk_job)
    assert "subdomain" not in jobset["spec"]["network"]  # JobSet's default: its own name, the TrainJob's
    cfg = cluster_runtime.load_config([*cluster_runtime.BASE_OVERRIDES, *cluster_runtime.DEFAULT_OVERRIDES])
    layout = manifests.kubernetes_layout(cfg, SDK_NAME)
    assert layout.server_endpoints[0] == f"{SDK_NAME}-ps-0-0.{SDK_NAME}:36000"
    templates = {rjob["name"]: rjob["template"]["spec"]["template"] for rjob in jobset["spec"]["replicatedJobs"]}
    for role, rjob, count in ((Role.SERVER, "ps", cfg.ps.servers), (Role.WORKER, "node", cfg.ps.workers)):
        (container,) = templates[rjob]["spec"]["containers"]
        assert container["resources"]["requests"]["cpu"]  # the workers' too: no TrainJob gives them
        for index in range(count):
            env = kubelet_env(container["env"], {manifests.JOBSET_NAME_FIELD: SDK_NAME,
                                                 manifests.COMPLETION_INDEX_FIELD: str(index),
                                                 manifests.JOBSET_RESTART_FIELD: "0"})
            expected = role_env(layout, role, index)
            assert {key: env[key] for key in expected} == expected, (role, index)
    assert cfg.ps.workers == runtime["spec"]["mlPolicy"]["numNodes"]


def test_the_command_refuses_a_backend_without_trainjobs(tmp_path, capsys):
    out = tmp_path / "runtime.yaml"
    assert cluster_runtime.main(["cluster.backend=jobset", *cluster_runtime.DEFAULT_OVERRIDES, "--data-uri",
                                 cluster_runtime.DEFAULT_DATA_URI, "--out", str(out)]) == 2
    assert "cluster.backend" in capsys.readouterr().err and not out.exists()
    # The model blends in the baseline (model.blend_baseline): a runtime without one is refused in one line.
    assert cluster_runtime.main([*cluster_runtime.DEFAULT_OVERRIDES, "--data-uri", "s3://b/d", "--out", str(out)]) == 2
    assert "model.blend_baseline" in capsys.readouterr().err and not out.exists()
    assert cluster_runtime.main([*cluster_runtime.DEFAULT_OVERRIDES, "ps.workers=3", "--data-uri", "s3://b/d",
                                 "--baseline-uri", "s3://b/baseline", "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["spec"]["mlPolicy"]["numNodes"] == 3
    assert '"baseline": "s3://b/baseline"' in out.read_text()
