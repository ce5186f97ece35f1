"""The CRDs in ../shared/schemas (Kubeflow Trainer, JobSet, paddle-operator): each kind's OpenAPI schema, which
an API server validates the kind's objects against."""

from __future__ import annotations

import functools

import yaml

from tests.conftest import SCHEMAS

CRD_FILES = {"JobSet": "jobset.x-k8s.io_jobsets.yaml", "PaddleJob": "batch.paddlepaddle.org_paddlejobs.yaml",
             "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
             "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
             "TrainJob": "trainer.kubeflow.org_trainjobs.yaml"}


@functools.cache  # the files are large: parsed once per session
def crd_schema(kind: str) -> dict:
    crd = yaml.load((SCHEMAS / CRD_FILES[kind]).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def crd_schemas() -> dict[str, dict]:
    """Every kind's schema; none when ../shared is absent."""
    return {kind: crd_schema(kind) for kind in CRD_FILES} if SCHEMAS.is_dir() else {}
