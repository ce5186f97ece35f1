"""The online server's InferenceService, checked offline: against KServe's CRD schema (../shared/schemas), the
Kubernetes client's models, and what the serving container must run with (the serve command on the export store,
the public key alone, the store's credentials by reference, the planned memory, a locked-down container)."""

import copy
import json

import jsonschema
import pytest
from kubernetes.client import ApiClient

from components.config import ConfigError
from components.config_rules import validate
from components.deploy.inference_service import (CONTAINER, PORT_NAME, SIGNING_KEY_DIR, inference_service,
                                                 serving_memory)
from components.export.serve_command import PUBLIC_KEY_ENV, READY_PATH, SERVING_PORT
from components.train.process_plan import compile_time_plan
from tests.conftest import PROD, needs_schemas
from tests.train.backends.crds import crd_schema

DIGEST = "sha256:" + "cd" * 32


@pytest.fixture
def prod(config):
    def composed(*overrides):
        cfg = config(*PROD, *overrides)
        validate(cfg)
        return cfg
    return composed


def _container(isvc: dict) -> dict:
    (container,) = isvc["spec"]["predictor"]["containers"]
    return container


def _round_trip(obj: dict, model: str) -> dict:
    """``obj`` through the Kubernetes client's model and back: a misspelt or misplaced field is dropped."""
    client = ApiClient()
    response = type("Response", (), {"data": json.dumps(obj)})()
    return client.sanitize_for_serialization(client.deserialize(response, model))


def pruned_fields(obj, schema: dict, path: str = "") -> list[str]:
    """Where ``obj`` has a field the schema does not know: the API server drops such fields of a structural schema
    (and jsonschema lets them pass, as the CRD does not set additionalProperties)."""
    if isinstance(obj, list):
        return [p for i, item in enumerate(obj) for p in pruned_fields(item, schema.get("items", {}), f"{path}[{i}]")]
    if not isinstance(obj, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    known = schema.get("properties")
    if known is None:  # a map (additionalProperties) or a free-form object
        return []
    return [p for key, value in obj.items()
            for p in ([f"{path}.{key}"] if key not in known else pruned_fields(value, known[key], f"{path}.{key}"))]


@needs_schemas
def test_the_inference_service_fits_kserves_crd(prod):
    isvc = inference_service(prod("cluster.serving.max_replicas=3", "cluster.image_pull_secrets=[regcred]"), "team-a")
    schema = crd_schema("InferenceService")
    jsonschema.validate(isvc, schema)
    assert pruned_fields(isvc, schema) == []
    assert pruned_fields({"spec": {"predictor": {"replicas": 2}}}, schema) == [".spec.predictor.replicas"]
    broken = copy.deepcopy(isvc)
    broken["spec"]["predictor"]["minReplicas"] = "one"
    with pytest.raises(jsonschema.ValidationError):  # strict enough to catch a wrong type
        jsonschema.validate(broken, schema)


def test_the_container_and_pod_fields_are_the_kubernetes_models(prod):
    isvc = inference_service(prod("cluster.image_pull_secrets=[regcred]"), "team-a")
    container = _container(isvc)
    assert _round_trip(container, "V1Container") == container
    for volume in isvc["spec"]["predictor"]["volumes"]:
        assert _round_trip(volume, "V1Volume") == volume


def test_the_predictor_runs_the_serve_command_on_the_export_store_of_the_pipeline_image(prod):
    cfg = prod(f"cluster.pipeline_image.digest={DIGEST}", "cluster.serving.name=ctr-prod")
    isvc = inference_service(cfg, "team-a")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert isvc["metadata"]["name"] == "ctr-prod" and isvc["metadata"]["namespace"] == "team-a"
    container = _container(isvc)
    assert container["name"] == CONTAINER
    assert container["image"] == f"registry.example.com/paddle-ps-pipelines:0.1.0@{DIGEST}"
    assert container["command"] == ["python", "-m", "components.export.serving", "serve", "--model",
                                    "s3://b/ckpt-serving", "--host", "0.0.0.0", "--port", "8080", "--name", "ctr-prod"]
    assert container["ports"] == [{"name": PORT_NAME, "containerPort": SERVING_PORT, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": READY_PATH, "port": SERVING_PORT}
    explicit = inference_service(prod("export.uri=s3://models/ctr"), "team-a")
    assert _container(explicit)["command"][5] == "s3://models/ctr"


def test_only_the_public_key_is_mounted_read_only_and_named_to_the_server(prod):
    isvc = inference_service(prod("export.signing_secret=team-a-signing"), "team-a")
    container = _container(isvc)
    env = {e["name"]: e for e in container["env"]}
    assert env[PUBLIC_KEY_ENV]["value"] == f"{SIGNING_KEY_DIR}/key.pub"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == SIGNING_KEY_DIR]
    assert mount["readOnly"] is True
    (volume,) = [v for v in isvc["spec"]["predictor"]["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "team-a-signing"
    assert volume["secret"]["items"] == [{"key": "key.pub", "path": "key.pub"}]  # never key.pem


def test_storage_credentials_are_secret_references_as_in_the_ps_pods(prod):
    container = _container(inference_service(prod(), "team-a"))
    env = {e["name"]: e for e in container["env"]}
    assert env["AWS_ACCESS_KEY_ID"] == {"name": "AWS_ACCESS_KEY_ID",
                                        "valueFrom": {"secretKeyRef": {"name": "ctr-storage", "key": "access_key_id"}}}
    assert "value" not in env["AWS_SECRET_ACCESS_KEY"]


def test_the_container_is_locked_down_with_writable_scratch_and_tmp_only(prod):
    isvc = inference_service(prod("cluster.run_as_user=2000"), "team-a")
    predictor, container = isvc["spec"]["predictor"], _container(isvc)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["runAsNonRoot"] is True
    assert security["runAsUser"] == 2000 and security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False
    assert predictor["automountServiceAccountToken"] is False
    empty_dirs = {v["name"] for v in predictor["volumes"] if "emptyDir" in v}
    writable = {m["mountPath"] for m in container["volumeMounts"] if m["name"] in empty_dirs}
    assert writable == {"/tmp", "/scratch"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HOME"] == env["TMPDIR"] == "/scratch"


def test_memory_is_the_serving_plan_when_the_configured_memory_is_less(prod):
    small = prod("cluster.serving.resources.memory=64Mi", "export.format=single", "table.vocab_size=20000000")
    memory, source = serving_memory(small)
    assert source.startswith("the serving plan") and memory.endswith("Gi")
    planned = compile_time_plan(small).process("serving").bytes
    assert int(memory[:-2]) * 2 ** 30 >= planned
    resources = _container(inference_service(small, "team-a"))["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == memory
    large = prod("cluster.serving.resources.memory=64Gi", "cluster.serving.resources.cpu=2")
    resources = _container(inference_service(large, "team-a"))["resources"]
    assert resources == {"requests": {"cpu": "2", "memory": "64Gi"}, "limits": {"cpu": "2", "memory": "64Gi"}}
    assert inference_service(large, "team-a")["spec"]["predictor"]["minReplicas"] == 1


@pytest.mark.parametrize("override,key", [
    ("cluster.serving.name=Ctr_Model", "cluster.serving.name"),
    ("cluster.serving.min_replicas=0", "cluster.serving.min_replicas"),
    ("cluster.serving.max_replicas=0", "cluster.serving.max_replicas"),
    ("cluster.serving.resources.gpus=1", "cluster.serving.resources.gpus"),
    ("cluster.serving.resources.memory=lots", "cluster.serving.resources.memory"),
    ("cluster.serving.ready_timeout_s=0", "cluster.serving.ready_timeout_s"),
    ("export.signing_secret=Bad_Name", "export.signing_secret"),
])
def test_bad_serving_settings_are_config_errors_naming_the_key(config, override, key):
    with pytest.raises(ConfigError) as raised:
        validate(config(*PROD, override))
    assert raised.value.key == key


def test_deploying_needs_the_sharded_export_in_a_remote_store_and_kubeflow(config):
    for overrides, key in ((("export.format=single",), "export.format"),
                           (("export.uri=/models/ctr",), "export.uri")):
        with pytest.raises(ConfigError) as raised:
            validate(config(*PROD, "cluster.serving.deploy=true", *overrides))
        assert raised.value.key == key
    with pytest.raises(ConfigError, match="a local run prints the serve command") as raised:
        validate(config("cluster.serving.deploy=true"))
    assert raised.value.key == "cluster.serving.deploy"
