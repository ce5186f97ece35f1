"""The CTR pipeline: resolve the config -> prepare data -> PS training -> evaluation, and beside it the export.

:func:`ctr_pipeline` builds the pipeline for one composed config. What is structural (server and worker
counts, images, resources, model, mode, ...) is compiled in as a constant; the knobs worth changing per
run are pipeline parameters whose defaults are the composed values (:data:`RUN_PARAMETERS`). The first
step, ``resolve-config``, applies them and outputs the effective config that every later step takes.

``kfp.local`` executes this pipeline for a local run (:mod:`pipelines.local`); :func:`compile_pipeline`
turns it into the IR YAML that Kubeflow Pipelines runs (:mod:`pipelines.kubeflow`).
"""

# No `from __future__ import annotations`: KFP reads the pipeline and component annotations as types.
import dataclasses
import os
from typing import NamedTuple

from kfp import compiler, dsl
from kfp.dsl import HTML, Artifact, Metrics, Model

from components.config import ClusterConfig, CtrConfig, PipelineRunner
from components.data_prep.component import prepare_data
from components.evaluate.component import evaluate_model
from components.export.component import export_model
from components.resolve.component import resolve_config
from components.resolve.step import config_struct, run_parameters
from components.train.component import train

PIPELINE_NAME = "ctr-ps-training"
TASKS = ("resolve-config", "prepare-data", "train", "evaluate-model", "export-model")  # a topological order
# What each task waits for: evaluation and export both start once training is done.
DEPENDENCIES = {"resolve-config": (), "prepare-data": ("resolve-config",), "train": ("resolve-config", "prepare-data"),
                "evaluate-model": ("resolve-config", "prepare-data", "train"),
                "export-model": ("resolve-config", "train")}
# The train step's launcher makes its own pod the owner of the PS job it creates (downward API).
LAUNCHER_POD_FIELDS = {"POD_NAME": "metadata.name", "POD_UID": "metadata.uid", "POD_NAMESPACE": "metadata.namespace"}

# Pipeline outputs: what a local run copies into its run directory.
Outputs = NamedTuple("Outputs", [("checkpoint", Model), ("logs", Artifact), ("metrics", Metrics),
                                 ("report", HTML), ("serving_model", Model)])


def compiled_config(cfg: CtrConfig) -> CtrConfig:
    """The config a pipeline carries, without what only the driver uses: ``run_dir`` (Hydra's folder) and
    ``cluster.image_signing_key`` (a file on the driver's machine, read into ``k8s/image-policy.yaml``)."""
    return dataclasses.replace(cfg, run_dir=".", cluster=dataclasses.replace(cfg.cluster, image_signing_key=None))


def ctr_pipeline(cfg: CtrConfig):
    """The pipeline for ``cfg``; call it with :func:`run_parameters` (kfp.local) or compile it."""
    config = config_struct(compiled_config(cfg))
    defaults = run_parameters(cfg)
    image = cfg.cluster.pipeline_image.reference
    on_kubeflow = cfg.cluster.runner is PipelineRunner.kubeflow

    @dsl.pipeline(name=PIPELINE_NAME, description="Parameter-server training of a CTR model on PaddlePaddle",
                  pipeline_root=cfg.cluster.pipeline_root)
    def pipeline(data_uri: str = defaults["data_uri"], epochs: int = defaults["epochs"],
                 learning_rate: float = defaults["learning_rate"],
                 table_learning_rate: float = defaults["table_learning_rate"],
                 batch_size: int = defaults["batch_size"], checkpoint_uri: str = defaults["checkpoint_uri"],
                 resume: str = defaults["resume"]) -> Outputs:
        resolved = resolve_config(config=config, data_uri=data_uri, epochs=epochs, learning_rate=learning_rate,
                                  table_learning_rate=table_learning_rate, batch_size=batch_size,
                                  checkpoint_uri=checkpoint_uri, resume=resume)
        # It checks the resume target against the checkpoint store, whose content changes between runs.
        resolved.set_caching_options(False)
        prep = prepare_data(config=resolved.output)
        fit = train(config=resolved.output, dataset=prep.outputs["dataset"])
        # The checkpoint lives outside the artifact store (checkpoint.uri): a cached step would only point at it.
        fit.set_caching_options(False)
        scored = evaluate_model(config=resolved.output, dataset=prep.outputs["dataset"],
                                checkpoint=fit.outputs["checkpoint"])
        served = export_model(config=resolved.output, checkpoint=fit.outputs["checkpoint"])
        tasks = (resolved, prep, fit, scored, served)
        for task in tasks:
            task.set_env_variable("PYTHONUNBUFFERED", "1")  # progress lines reach the logs as they happen
            task.set_container_image(image)
        if on_kubeflow:
            add_kubernetes_settings(cfg.cluster, tasks, fit)
        return Outputs(checkpoint=fit.outputs["checkpoint"], logs=fit.outputs["logs"],
                       metrics=scored.outputs["metrics"], report=scored.outputs["report"],
                       serving_model=served.outputs["serving_model"])

    return pipeline


def add_kubernetes_settings(cluster: ClusterConfig, tasks, train_task) -> None:
    """Pod settings of the Kubeflow run: storage credentials as secret references only, non-root, and the
    train step's own pod identity."""
    from kfp import kubernetes

    for task in tasks:
        for secret in cluster.storage_secrets:
            kubernetes.use_secret_as_env(task, secret_name=secret.name,
                                         secret_key_to_env={key: env for env, key in secret.keys.items()})
        kubernetes.set_security_context(task, run_as_user=cluster.run_as_user, run_as_non_root=True)
    for env, field_path in LAUNCHER_POD_FIELDS.items():
        kubernetes.use_field_path_as_env(train_task, env_name=env, field_path=field_path)


def compile_pipeline(cfg: CtrConfig, path: str | os.PathLike) -> str:
    """Write the IR YAML of ``cfg``'s pipeline to ``path`` (with the Kubernetes platform spec when
    ``cluster.runner=kubeflow``); returns the path."""
    path = os.fspath(path)
    compiler.Compiler().compile(pipeline_func=ctr_pipeline(cfg), package_path=path)
    return path
