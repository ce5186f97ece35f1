"""The Kubeflow pipeline with ``cluster.serving.deploy=true``: its last step creates or updates the online server's
InferenceService after the export, inside the AUC gate, as the launcher account, which may do exactly that."""

import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from components.config import from_dict
from components.config_rules import validate
from components.train.backends import manifests, rbac
from pipelines.kubeflow import INFERENCE_SERVICE_FILE, RBAC_FILE, write_run_files
from pipelines.pipeline import DEPLOY_POD_FIELDS, DEPLOY_TASK, EXIT_TASK, RETRIED_TASKS, TASKS
from tests.conftest import PROD, compose_config
from tests.pipelines.spec import pipeline_tasks


def _prod(tmp_path, *overrides):
    cfg = from_dict(compose_config(tmp_path, *PROD, "eval.min_auc=0.7", *overrides))
    validate(cfg)
    return cfg


def test_deploy_model_follows_the_export_inside_the_auc_gate_as_the_launcher(tmp_path):
    out = tmp_path / "compiled"
    write_run_files(_prod(tmp_path, "cluster.serving.deploy=true", "cluster.serving.name=ctr-eu"), out)
    documents = list(yaml.safe_load_all((out / "pipeline.yaml").read_text()))
    tasks = pipeline_tasks(json_format.ParseDict(documents[0], pipeline_spec_pb2.PipelineSpec()))
    assert set(tasks) == {*TASKS, EXIT_TASK, DEPLOY_TASK}
    deploy, gate = tasks[DEPLOY_TASK]
    assert gate is tasks["export-model"][1] is not None  # the AUC gate's group
    assert list(deploy.dependent_tasks) == ["export-model"]
    assert deploy.inputs.artifacts["serving_model"].task_output_artifact.producer_task == "export-model"
    assert not deploy.caching_options.enable_cache and DEPLOY_TASK in RETRIED_TASKS
    assert deploy.task_info.name == "Deploy the online server (InferenceService ctr-eu)"

    executors = documents[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    platform = executors[f"exec-{DEPLOY_TASK}"]
    assert {f["name"]: f["fieldPath"] for f in platform["fieldPathAsEnv"]} == DEPLOY_POD_FIELDS
    assert "secretAsVolume" not in platform  # it requests the launcher account's tokens: none is mounted
    env = documents[0]["deploymentSpec"]["executors"][f"exec-{DEPLOY_TASK}"]["container"]["env"]
    assert {"name": manifests.LAUNCHER_ACCOUNT_ENV, "value": "ctr-ps-launcher"} in env
    assert "secretAsEnv" not in platform  # it reads no storage; the InferenceService's pods have their references

    role = next(obj for obj in yaml.safe_load_all((out / RBAC_FILE).read_text()) if obj["kind"] == "Role")
    serving = [rule for rule in role["rules"] if rule["apiGroups"] == ["serving.kserve.io"]]
    assert serving == [
        {"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"], "verbs": ["create"]},
        {"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"], "resourceNames": ["ctr-eu"],
         "verbs": ["get", "update"]}]
    service = yaml.safe_load((out / INFERENCE_SERVICE_FILE).read_text())
    assert service["metadata"]["name"] == "ctr-eu"
    assert "deploy-model step creates or updates it" in (out / INFERENCE_SERVICE_FILE).read_text()


def test_without_deploy_the_launcher_may_not_touch_inference_services(tmp_path):
    role = next(obj for obj in rbac.launcher_rbac(_prod(tmp_path)) if obj["kind"] == "Role")
    assert not [rule for rule in role["rules"] if "inferenceservices" in rule["resources"]]
