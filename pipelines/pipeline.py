"""The CTR pipeline: prepare data -> PS training -> evaluation, and beside it the serving model export.

This one definition is what ``kfp.local`` executes for a local run (:mod:`pipelines.local`) and what
:func:`compile_pipeline` turns into the IR YAML submitted to Kubeflow Pipelines. Its only parameter is
the resolved config as a dict (:func:`pipeline_arguments`); every step rebuilds the typed config.
"""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
import os
from typing import Any, NamedTuple

from kfp import compiler, dsl
from kfp.dsl import HTML, Artifact, Metrics, Model

from components.config import CtrConfig, to_dict
from components.data_prep.component import prepare_data
from components.evaluate.component import evaluate_model
from components.export.component import export_model
from components.train.component import train

PIPELINE_NAME = "ctr-ps-training"
TASKS = ("prepare-data", "train", "evaluate-model", "export-model")  # a topological order
# What each task waits for: evaluation and export both start once training is done.
DEPENDENCIES = {"prepare-data": (), "train": ("prepare-data",), "evaluate-model": ("prepare-data", "train"),
                "export-model": ("train",)}

# Pipeline outputs: what a local run copies into its run directory.
Outputs = NamedTuple("Outputs", [("checkpoint", Model), ("logs", Artifact), ("metrics", Metrics),
                                 ("report", HTML), ("serving_model", Model)])


@dsl.pipeline(name=PIPELINE_NAME, description="Parameter-server training of a CTR model on PaddlePaddle")
def ctr_pipeline(config: dict) -> Outputs:
    prep = prepare_data(config=config)
    fit = train(config=config, dataset=prep.outputs["dataset"])
    # The checkpoint lives outside the artifact store (checkpoint.uri): a cached step would only point at it.
    fit.set_caching_options(False)
    scored = evaluate_model(config=config, dataset=prep.outputs["dataset"], checkpoint=fit.outputs["checkpoint"])
    served = export_model(config=config, checkpoint=fit.outputs["checkpoint"])
    for task in (prep, fit, scored, served):
        task.set_env_variable("PYTHONUNBUFFERED", "1")  # progress lines reach the logs as they happen
    return Outputs(checkpoint=fit.outputs["checkpoint"], logs=fit.outputs["logs"],
                   metrics=scored.outputs["metrics"], report=scored.outputs["report"],
                   serving_model=served.outputs["serving_model"])


def _drop_nones(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nones(v) for v in value]
    return value


def pipeline_arguments(cfg: CtrConfig) -> dict:
    """The ``config`` argument of a run: the JSON-safe config without null values.

    A pipeline parameter is a protobuf Struct, which KFP fills without nulls; every null in the schema
    is an ``Optional`` field whose default is null, so the steps' ``from_dict`` restores it.
    """
    return _drop_nones(to_dict(cfg))


def compile_pipeline(path: str | os.PathLike) -> str:
    """Write the pipeline's IR YAML to ``path``; returns the path."""
    path = os.fspath(path)
    compiler.Compiler().compile(pipeline_func=ctr_pipeline, package_path=path)
    return path


if __name__ == "__main__":
    import sys

    print(compile_pipeline(sys.argv[1] if len(sys.argv) > 1 else f"{PIPELINE_NAME}.yaml"))
