"""KFP v2 component applying a run's parameters to the config; the code it runs is :mod:`components.resolve.step`."""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from typing import NamedTuple

from kfp import dsl

from components.config import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def resolve_config(config: dict, data_uri: str, epochs: int, learning_rate: float, table_learning_rate: float,
                   batch_size: int, checkpoint_uri: str, resume: str, day: str, schedule_time: str = ""
                   ) -> NamedTuple("Resolved", [("config", dict), ("train", bool), ("checkpoint_uri", str)]):
    """The compiled-in config with this run's parameters applied, validated: what every later step uses; whether
    the run trains (false: its day is trained already); its checkpoint store. ``schedule_time``: the run's scheduled
    time (KFP's placeholder), from which a daily run without a ``day`` takes its day."""
    from components.resolve.step import effective_config

    return effective_config(config, schedule_time=schedule_time, data_uri=data_uri, epochs=epochs,
                            learning_rate=learning_rate, table_learning_rate=table_learning_rate,
                            batch_size=batch_size, checkpoint_uri=checkpoint_uri, resume=resume, day=day)
