"""KFP v2 components for data prep; the code they run is :mod:`components.data_prep.step`."""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from typing import List

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Output

from components.config import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def plan_data(config: dict) -> List[dict]:
    """List the input and cut it into units; one item per convert-data task: the plan and its units."""
    from components.data_prep.step import plan_dataset

    return plan_dataset(config)


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def convert_data(group: dict, parts: Output[Artifact]):
    """One group of units -> their MultiSlot parts, counts and distinct-id counters."""
    from components.data_prep.step import convert_units

    convert_units(group, parts.path)


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def merge_data(groups: List[dict], parts: Input[List[Artifact]], dataset: Output[Dataset]):
    """Every group's parts -> sharded MultiSlot train/valid/test splits + stats.json; day partitions: fails on a
    broken day (its drift against the day before, in stats.json)."""
    from components.checkpoint.days import ledger_at
    from components.data_prep.step import merge_parts

    dataset.metadata.update(merge_parts(groups, [part.path for part in parts], dataset.path, ledger_at))
