"""KFP v2 component exporting the servable model; the code it runs is :mod:`components.export.step`."""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

from components.config import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def export_model(config: dict, checkpoint: Input[Model], dataset: Input[Dataset], serving_model: Output[Model]):
    """The trained checkpoint as the next version of the export store (``export.format=sharded``: the dense
    program plus embedding shards, a base or a delta) or a single-file Paddle inference model, with the transform
    of the ``dataset`` it trained on (raw records in), run by ``python -m components.export.serving predict``."""
    from components.export.step import export_serving_model

    serving_model.metadata.update(export_serving_model(config, checkpoint.path, checkpoint.metadata,
                                                       serving_model.path, dataset.path))
