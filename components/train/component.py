"""KFP v2 component for PS training; the code it runs is :mod:`components.train.step`."""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components.config import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def train(config: dict, dataset: Input[Dataset], checkpoint: Output[Model], logs: Output[Artifact]):
    """The PS job (servers + workers) on the prepared dataset; checkpoint at ``checkpoint.uri``."""
    from components.train.step import train_model

    # Local processes read dataset.path; pods on Kubernetes fetch their shards from dataset.uri.
    checkpoint.metadata.update(train_model(config, dataset.path, checkpoint.path, logs.path, data_uri=dataset.uri))
