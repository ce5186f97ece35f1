"""KFP v2 component exporting the servable model; the code it runs is :mod:`components.export.step`."""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from kfp import dsl
from kfp.dsl import Input, Model, Output

from components.config import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def export_model(config: dict, checkpoint: Input[Model], serving_model: Output[Model]):
    """The trained checkpoint as a Paddle inference model (``.pdmodel`` + ``.pdiparams``, ``ids.npy``,
    ``serving.json``), run by ``python -m components.serving predict``."""
    from components.export.step import export_serving_model

    serving_model.metadata.update(export_serving_model(config, checkpoint.path, checkpoint.metadata,
                                                       serving_model.path))
