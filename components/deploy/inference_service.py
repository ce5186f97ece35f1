"""The online server's KServe ``InferenceService`` (``serving.kserve.io/v1beta1``): a pure function from the config
to the manifest (a plain dict), which the deploy step creates or updates (:mod:`components.deploy.step`) and the
Kubeflow compile writes for review (``k8s/inference-service.yaml``).

A custom predictor: one container (``kserve-container``, the name KServe gives a custom predictor's) on the
pipeline image, running ``python -m components.export.serving serve`` on the export store
(:func:`components.export.store.export_store_uri`), which it follows: a new export reaches the running replicas
without a new deployment. Its port is named ``http1`` (Knative's name for an HTTP/1 port); it is Ready when
``/v2/health/ready`` answers. Memory: the larger of ``cluster.serving.resources.memory`` and the planner's serving
plan with its margin (:func:`components.train.process_plan.step_memory`, as the evaluate and export steps).

What it trusts: the export's signature is checked with the public key alone, the ``key.pub`` item of the Secret
``export.signing_secret`` mounted read-only (the private key in the same Secret never reaches a serving pod). The
store's credentials arrive as ``cluster.storage_secrets`` references, as in every other pod. The container runs as
``cluster.run_as_user``, non-root, every capability dropped, no privilege escalation, a read-only root filesystem
(its writable places: emptyDirs at the image's HOME and TMPDIR, ``/scratch``, and at ``/tmp``), and without an API
token. The security settings sit on the container, not the pod: in KServe's default (serverless) mode Knative admits
only a few pod-level ones.
"""

from __future__ import annotations

from components.config import CtrConfig
from components.export.serve_command import PUBLIC_KEY_ENV, READY_PATH, SERVING_PORT, serve_command
from components.export.store import export_store_uri
from components.train.backends.manifests import (CONTAINER_SECURITY_CONTEXT, INFERENCE_SERVICES, KSERVE_API, SCRATCH,
                                                 TMP, storage_secret_env)
from components.train.process_plan import compile_time_plan, step_memory

SERVING_API, PLURAL, KIND = KSERVE_API, INFERENCE_SERVICES, "InferenceService"
CONTAINER = "kserve-container"
PORT_NAME = "http1"
# Where the serving container finds the export signing key (as the export step mounts the same Secret).
SIGNING_KEY_DIR = "/var/run/secrets/ctr-export-signing"
PUBLIC_KEY_ITEM = "key.pub"
COMPONENT_LABEL = "serving"
# A new replica loads the export before it is Ready (a base's shards from the store): give it time before the
# kubelet's probe counts failures.
READY_PROBE = {"initialDelaySeconds": 5, "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3}


def serving_memory(cfg: CtrConfig) -> tuple[str, str]:
    """``(a replica's memory request and limit, where it comes from)``: ``cluster.serving.resources.memory``, or the
    serving plan (the rows one batch touches: the shards are memory-mapped) times the margin when that is more."""
    return step_memory(cfg.cluster.serving.resources.memory, compile_time_plan(cfg).process("serving"),
                       "cluster.serving.resources.memory")


def _resources(cfg: CtrConfig) -> dict:
    resources = cfg.cluster.serving.resources
    memory, _ = serving_memory(cfg)
    return {"requests": {"cpu": resources.cpu, "memory": memory},
            "limits": {"cpu": resources.cpu_limit or resources.cpu, "memory": memory}}


def serving_container(cfg: CtrConfig) -> dict:
    uid = cfg.cluster.run_as_user
    serving = cfg.cluster.serving
    env = [{"name": PUBLIC_KEY_ENV, "value": f"{SIGNING_KEY_DIR}/{PUBLIC_KEY_ITEM}"},
           {"name": "HOME", "value": SCRATCH}, {"name": "TMPDIR", "value": SCRATCH},
           {"name": "PYTHONUNBUFFERED", "value": "1"}, *storage_secret_env(cfg)]
    return {
        "name": CONTAINER,
        "image": cfg.cluster.pipeline_image.reference,
        "command": serve_command(export_store_uri(cfg), serving.name, host="0.0.0.0", port=SERVING_PORT),
        "workingDir": SCRATCH,
        "env": env,
        "ports": [{"name": PORT_NAME, "containerPort": SERVING_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": READY_PATH, "port": SERVING_PORT}, **READY_PROBE},
        "resources": _resources(cfg),
        "securityContext": {**CONTAINER_SECURITY_CONTEXT, "runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "signing-key", "mountPath": SIGNING_KEY_DIR, "readOnly": True},
                         {"name": "scratch", "mountPath": SCRATCH}, {"name": "tmp", "mountPath": TMP}],
    }


def inference_service(cfg: CtrConfig, namespace: str) -> dict:
    """The InferenceService serving ``cfg``'s export store as ``cluster.serving.name`` in ``namespace``."""
    serving = cfg.cluster.serving
    predictor = {
        "minReplicas": serving.min_replicas,
        "maxReplicas": serving.max_replicas,
        "automountServiceAccountToken": False,
        "containers": [serving_container(cfg)],
        "volumes": [
            # 0444: readable by the container's user without a pod-level fsGroup; a public key.
            {"name": "signing-key", "secret": {"secretName": cfg.export.signing_secret, "defaultMode": 0o444,
                                               "items": [{"key": PUBLIC_KEY_ITEM, "path": PUBLIC_KEY_ITEM}]}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    if cfg.cluster.image_pull_secrets:
        predictor["imagePullSecrets"] = [{"name": secret} for secret in cfg.cluster.image_pull_secrets]
    labels = {"app.kubernetes.io/name": "ctr-ps", "app.kubernetes.io/component": COMPONENT_LABEL}
    return {"apiVersion": SERVING_API, "kind": KIND,
            "metadata": {"name": serving.name, "namespace": namespace, "labels": labels},
            "spec": {"predictor": predictor}}
