"""What a Kubeflow run's exit handler calls: delete every PS job object the run created, found by the run's label
(:data:`~components.train.backends.manifests.PIPELINE_RUN_LABEL`). The train step deletes its own job itself;
this catches what a step killed outright, or a run cancelled before the step could clean up, left behind. The exit
task of the Kubeflow pipeline (``components/cleanup/component.py``) runs it as the launcher account,
which ``k8s/rbac.yaml`` lets list and delete each kind here (:mod:`components.train.backends.rbac`)."""

from __future__ import annotations

import os
from typing import Callable, Optional

from kubernetes.client.exceptions import ApiException

from components.config import ClusterBackend, ClusterConfig
from components.train.backends import manifests
from components.train.backends.kubernetes.api import KubeApis, KubeObject, launcher_namespace

_NETWORK_POLICY = ("networking.k8s.io/v1", "NetworkPolicy")
# The kinds each backend creates, in the order it creates them (manifests.job_manifests): deleted in reverse,
# the job first, so that nothing is left running without its NetworkPolicy or TrainingRuntime.
RUN_OBJECT_KINDS = {
    ClusterBackend.trainjob: [_NETWORK_POLICY, (manifests.TRAINER_API, "TrainingRuntime"),
                              (manifests.TRAINER_API, "TrainJob")],
    ClusterBackend.jobset: [_NETWORK_POLICY, (manifests.JOBSET_API, "JobSet")],
    ClusterBackend.paddlejob: [_NETWORK_POLICY, (manifests.PADDLEJOB_API, "PaddleJob")],
}


def delete_pipeline_run_objects(cluster: ClusterConfig, pipeline_run: Optional[str] = None, *,
                                apis: Optional[KubeApis] = None, echo: Callable[[str], None] = print) -> list[str]:
    """Delete the objects of every PS job the Kubeflow run ``pipeline_run`` created for ``cluster.backend``, in
    the namespace the train step uses (its pod's, else ``cluster.namespace``); returns what it deleted
    (``"TrainJob ctr-ps-1a2b3c4d"``, ...).

    ``pipeline_run`` defaults to ``$PIPELINE_RUN_ID``, which the train step reads too (the run's pod label).
    Idempotent: what is gone already, or a kind whose CRD is not installed, is nothing to delete; an object still
    terminating may be asked again, which is harmless. Any other API error (403: the account lacks what
    ``k8s/rbac.yaml`` grants) is raised, so that the exit handler's failure shows it.
    """
    pipeline_run = pipeline_run or os.environ.get(manifests.PIPELINE_RUN_ENV)
    if not pipeline_run:
        raise ValueError(f"no pipeline run to clean up: pass its id or set ${manifests.PIPELINE_RUN_ENV}")
    apis = apis or KubeApis.from_environment()
    namespace, selector = launcher_namespace(cluster), manifests.pipeline_run_selector(pipeline_run)
    deleted = []
    for api_version, kind in reversed(RUN_OBJECT_KINDS[cluster.backend]):
        try:
            found = KubeObject.labelled(apis, api_version, kind, namespace, selector)
        except ApiException as err:
            if err.status != 404:
                raise
            found = []
        for obj in found:
            obj.delete(apis)
            echo(f"deleted {obj} (pipeline run {pipeline_run})")
            deleted.append(str(obj))
    return deleted
