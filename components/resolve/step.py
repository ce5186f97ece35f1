"""What the resolve step runs: the compiled-in config plus this run's parameters -> the effective config.

A compiled pipeline carries the composed config as a constant: server and worker counts, images, model,
mode and the rest are fixed when it is compiled. The knobs worth changing from one run to the next are
run parameters (:data:`RUN_PARAMETERS`), which the Kubeflow UI offers with the composed values as
defaults. This first, light step applies them, validates the result (and that a resume target exists)
before any heavy step starts, prints it, and outputs it; every later step takes that output, so the run
records the config it really used.
"""

import dataclasses
from typing import Any

from omegaconf import OmegaConf

from components.config import ConfigError, CtrConfig, DataSource, from_dict, to_dict, validate

# Run parameter -> the config key it sets.
RUN_PARAMETERS = {
    "data_uri": "data.uri",  # "" = synthetic data; anything else: files in data.format at that URI
    "epochs": "ps.epochs",
    "learning_rate": "model.learning_rate",
    "table_learning_rate": "table.learning_rate",
    "batch_size": "ps.batch_size",
    "checkpoint_uri": "checkpoint.uri",
    "resume": "checkpoint.resume",
}


def run_parameters(cfg: CtrConfig) -> dict:
    """The run parameters' values that reproduce ``cfg`` (the defaults a compiled pipeline offers)."""
    return {
        "data_uri": (cfg.data.uri or "") if cfg.data.source is DataSource.files else "",
        "epochs": cfg.ps.epochs,
        "learning_rate": cfg.model.learning_rate,
        "table_learning_rate": cfg.table.learning_rate,
        "batch_size": cfg.ps.batch_size,
        "checkpoint_uri": cfg.checkpoint.uri,
        "resume": cfg.checkpoint.resume,
    }


def apply_run_parameters(cfg: CtrConfig, *, data_uri: str, epochs: int, learning_rate: float,
                         table_learning_rate: float, batch_size: int, checkpoint_uri: str, resume: str) -> CtrConfig:
    data = (dataclasses.replace(cfg.data, source=DataSource.files, uri=data_uri) if data_uri
            else dataclasses.replace(cfg.data, source=DataSource.synthetic, uri=None))
    return dataclasses.replace(
        cfg, data=data,
        ps=dataclasses.replace(cfg.ps, epochs=epochs, batch_size=batch_size),
        model=dataclasses.replace(cfg.model, learning_rate=learning_rate),
        table=dataclasses.replace(cfg.table, learning_rate=table_learning_rate),
        checkpoint=dataclasses.replace(cfg.checkpoint, uri=checkpoint_uri, resume=resume))


def _drop_nones(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nones(v) for v in value]
    return value


def config_struct(cfg: CtrConfig) -> dict:
    """The config as a KFP dict value: JSON-safe, without null values.

    A dict parameter is a protobuf Struct, which KFP fills without nulls; every null in the schema is an
    ``Optional`` field whose default is null, so :func:`components.config.from_dict` restores it.
    """
    return _drop_nones(to_dict(cfg))


def check_checkpoint_store(cfg: CtrConfig, probe: bool = True) -> None:
    """Before anything starts: the checkpoint store takes a write, a read and a delete (a missing bucket, no
    permission, a read-only directory fail here, not after a pass), no other run holds it, and a resume or
    warm-start target names a committed checkpoint (``resume=latest`` on an empty store included).

    ``probe=False`` (``plan=true``) writes nothing: the store is only read."""
    from components.checkpoint.format import CheckpointError
    from components.checkpoint.lease import in_use_message, live_holder
    from components.checkpoint.restore import restore_target
    from components.checkpoint.store import CheckpointStore, CheckpointStoreError, redact

    uri = cfg.checkpoint.uri
    try:
        store = CheckpointStore(uri)
        if probe:
            store.probe()
        holder = live_holder(store)
    except CheckpointStoreError as err:
        raise ConfigError("checkpoint.uri", redact(uri), "a store this machine can write, read and delete in",
                          str(err)) from None
    if holder is not None:
        raise ConfigError("checkpoint.uri", store.display_uri, "a store no other run is using",
                          in_use_message(store, holder))
    try:
        restore_target(store, cfg.checkpoint.resume, cfg.checkpoint.warm_start)
    except CheckpointError as err:
        key, value = (("checkpoint.warm_start", cfg.checkpoint.warm_start) if "warm_start" in str(err)
                      else ("checkpoint.resume", cfg.checkpoint.resume))
        raise ConfigError(key, value, "none, latest, auto or a committed checkpoint id", str(err)) from None


def effective_config(config: Any, **run_parameters: Any) -> dict:
    """Apply the run parameters to the compiled-in ``config``, check the result, print it, return it as a dict.

    Raises :class:`ConfigError` (the step fails, naming the key) for a value that cannot work.
    """
    cfg = apply_run_parameters(from_dict(config), **run_parameters)
    validate(cfg)
    check_checkpoint_store(cfg)
    resolved = config_struct(cfg)
    print("effective config:\n" + OmegaConf.to_yaml(OmegaConf.create(resolved)), flush=True)
    return resolved
