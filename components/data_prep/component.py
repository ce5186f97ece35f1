"""KFP v2 component for data prep; the code it runs is :mod:`components.data_prep.step`."""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from kfp import dsl
from kfp.dsl import Dataset, Output

from components.config import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def prepare_data(config: dict, data_fingerprint: str, dataset: Output[Dataset]):
    """Synthetic or file data -> sharded MultiSlot train/test splits + stats.json. ``data_fingerprint`` (of the
    input files) is an input so that the cached dataset is reused only for the same files."""
    from components.data_prep.step import dataset_metadata, prepare_dataset

    dataset.metadata.update(dataset_metadata(prepare_dataset(config, dataset.path)))
    dataset.metadata["input_fingerprint"] = data_fingerprint
