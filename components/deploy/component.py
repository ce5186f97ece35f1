"""KFP v2 component deploying the online server; the code it runs is :mod:`components.deploy.step`."""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from kfp import dsl
from kfp.dsl import Input, Model

from components.config import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def deploy_model(config: dict, serving_model: Input[Model]) -> str:
    """Create or update the KServe InferenceService that serves the export store ``serving_model`` is a version of
    (it follows the store: later exports reach it without a new deployment); returns its URL once it is Ready."""
    from components.deploy.step import deploy_model as deploy

    return deploy(config)
