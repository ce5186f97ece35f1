"""The CRDs in ../shared/schemas (Kubeflow Trainer, JobSet, paddle-operator; KServe): each kind's OpenAPI schema,
which an API server validates the kind's objects against."""

from __future__ import annotations

import functools

import yaml

from tests.conftest import SCHEMAS

CRD_FILES = {"JobSet": "jobset.x-k8s.io_jobsets.yaml", "PaddleJob": "batch.paddlepaddle.org_paddlejobs.yaml",
             "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
             "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
             "TrainJob": "trainer.kubeflow.org_trainjobs.yaml"}
# The online server's (components.deploy), apart: the launcher's emulated clusters need not parse its 2 MB.
SERVING_CRD_FILES = {"InferenceService": "serving.kserve.io_inferenceservices.yaml"}


@functools.cache  # the files are large: parsed once per session
def crd_schema(kind: str) -> dict:
    crd = yaml.load((SCHEMAS / {**CRD_FILES, **SERVING_CRD_FILES}[kind]).read_text(),
                    Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def crd_schemas(kinds=tuple(CRD_FILES)) -> dict[str, dict]:
    """The schemas of ``kinds`` (default: the PS job's); none when ../shared is absent."""
    return {kind: crd_schema(kind) for kind in kinds} if SCHEMAS.is_dir() else {}
