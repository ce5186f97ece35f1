"""What the resolve step runs: the compiled-in config plus this run's parameters -> the effective config.

A compiled pipeline carries the composed config as a constant: server and worker counts, images, model,
mode and the rest are fixed when it is compiled. The knobs worth changing from one run to the next are
run parameters (:data:`RUN_PARAMETERS`), which the Kubeflow UI offers with the composed values as
defaults. This first, light step applies them, validates the result (and that a resume target exists)
before any heavy step starts, prints it, and outputs it; every later step takes that output, so the run
records the config it really used.

A run with day partitions (``data.uri`` holding ``{day}``: :mod:`components.days`) trains one day: the ``day`` run
parameter, else the day its scheduled time names (a recurring run). This step checks that day's input, and whether
the checkpoint store has trained it already (:class:`components.checkpoint.days.DayLedger`): its second output,
``train``, is then false, and on Kubeflow the steps after it are skipped (:func:`day_gated`).
"""

import dataclasses
from typing import Any, NamedTuple, Optional

from omegaconf import OmegaConf

from components.config import ClusterBackend, ConfigError, CtrConfig, DataSource, PipelineRunner, from_dict, to_dict
from components.config_rules import validate
from components.data_prep.input_checks import check_inputs
from components.days import is_daily, scheduled_day

# Run parameter -> the config key it sets.
RUN_PARAMETERS = {
    "data_uri": "data.uri",  # "" = synthetic data; anything else: files in data.format at that URI
    "epochs": "ps.epochs",
    "learning_rate": "model.learning_rate",
    "table_learning_rate": "table.learning_rate",
    "batch_size": "ps.batch_size",
    "checkpoint_uri": "checkpoint.uri",
    "resume": "checkpoint.resume",
    "day": "data.day",  # "" = none: a recurring run's day comes from its scheduled time
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
        "day": cfg.data.day or "",
    }


def apply_run_parameters(cfg: CtrConfig, *, data_uri: str, epochs: int, learning_rate: float,
                         table_learning_rate: float, batch_size: int, checkpoint_uri: str, resume: str,
                         day: str) -> CtrConfig:
    data = (dataclasses.replace(cfg.data, source=DataSource.files, uri=data_uri) if data_uri
            else dataclasses.replace(cfg.data, source=DataSource.synthetic, uri=None))
    return dataclasses.replace(
        cfg, data=dataclasses.replace(data, day=day or None),
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


def check_checkpoint_store(cfg: CtrConfig, probe: bool = True) -> CtrConfig:
    """Before anything starts: the checkpoint store takes a write, a read and a delete (a missing bucket, no
    permission, a read-only directory fail here, not after a pass), no other run holds it, and a resume or
    warm-start target names a committed checkpoint that is intact (``resume=latest`` on an empty store included).

    Returns ``cfg``, or, when the newest checkpoint was corrupt and an older one taken instead (one warning line),
    ``cfg`` naming that one (:func:`pinned`): the later steps start from it without checking the newest again.
    ``probe=False`` (``plan=true``) writes nothing: the store is only read."""
    from components.checkpoint.format import CheckpointError
    from components.checkpoint.lease import in_use_message, live_holder
    from components.checkpoint.restore import restore_target, warning
    from components.checkpoint.store import CheckpointStore, CheckpointStoreError
    from components.redaction import redact

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
    fell_back: list[str] = []
    daily = is_daily(cfg.data.uri)
    try:
        # A daily run's target is the day's, which the train step resolves and checks; resume only says where to look.
        target = restore_target(store, cfg.checkpoint.resume, cfg.checkpoint.warm_start, verify=not daily,
                                warn=lambda message: (fell_back.append(message), warning(message)))
    except CheckpointStoreError as err:
        raise ConfigError("checkpoint.uri", store.display_uri, "a store this machine can read", str(err)) from None
    except CheckpointError as err:
        key, value = (("checkpoint.warm_start", cfg.checkpoint.warm_start) if "warm_start" in str(err)
                      else ("checkpoint.resume", cfg.checkpoint.resume))
        raise ConfigError(key, value, "none, latest, auto or a committed checkpoint id", str(err)) from None
    if target is not None and target.resume and not daily:
        check_passes_left(cfg, store, target.id)
    return pinned(cfg, target) if fell_back else cfg


def pinned(cfg: CtrConfig, target: Any) -> CtrConfig:
    """``cfg`` naming the checkpoint ``target`` (a RestoreTarget) is: its resume id, or its warm start's."""
    checkpoint = (dataclasses.replace(cfg.checkpoint, resume=target.id) if target.resume
                  else dataclasses.replace(cfg.checkpoint, warm_start=f"{target.uri}#{target.id}"))
    return dataclasses.replace(cfg, checkpoint=checkpoint)


def check_local_host(cfg: CtrConfig) -> Optional[str]:
    """The local backend's ``ps.host`` is an address of this machine (every role binds it: a ConfigError now, not
    an OSError in the train step after data prep), and a loopback one unless ``ps.allow_external_bind``: the PS
    plane is plaintext and answers any peer that reaches it (docs/security.md). Returns the warning to print once
    (the driver does) when an external address is allowed, else None."""
    import ipaddress
    import socket

    if cfg.cluster.backend is not ClusterBackend.local:
        return None
    host = cfg.ps.host
    try:
        family, _, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
    except OSError as err:
        reason = err.strerror or str(err)
        raise ConfigError("ps.host", host, "an address of this machine (127.0.0.1, or one of its interfaces')",
                          f"the local backend's servers and workers cannot listen on it: {reason}") from None
    if ipaddress.ip_address(address[0]).is_loopback:
        return None
    exposure = (f"every role's plaintext PS, worker and rendezvous ports listen on {address[0]}, open to any "
                "peer that reaches it (brpc takes table commands such as PS_STOP_SERVER from anyone connected)")
    if not cfg.ps.allow_external_bind:
        raise ConfigError("ps.host", host, "a loopback address (127.0.0.1) unless ps.allow_external_bind=true",
                          f"{exposure}; keep 127.0.0.1, or set ps.allow_external_bind=true on a trusted network")
    return f"warning: ps.host={host}: {exposure} (ps.allow_external_bind=true)"


def check_passes_left(cfg: CtrConfig, store: Any, ckpt_id: str) -> None:
    """A resumed checkpoint that finished ``ps.epochs`` passes leaves nothing to train: say so before any work."""
    from components.checkpoint.restore import STATE_FILE

    state = store.read_json(ckpt_id, STATE_FILE) or {}
    done = int(state.get("epoch", 0))
    if not state.get("chunk") and done >= cfg.ps.epochs:
        raise ConfigError("ps.epochs", cfg.ps.epochs, f"more than the {done} passes checkpoint {ckpt_id} has "
                          "trained already", f"checkpoint.resume={cfg.checkpoint.resume} continues after them: raise "
                          f"ps.epochs (ps.epochs={done + 1} trains one more pass), or start fresh with "
                          "checkpoint.resume=none or another checkpoint.uri")


def day_gated(cfg: CtrConfig) -> bool:
    """Whether the steps after this one run only when its ``train`` output is true: a daily pipeline on Kubeflow.
    kfp.local (2.17) evaluates no condition on a named task output (it reads every such condition as false), so a
    local daily pipeline runs its steps ungated, and its driver skips the days trained already."""
    return is_daily(cfg.data.uri) and cfg.cluster.runner is PipelineRunner.kubeflow


def with_run_day(cfg: CtrConfig, schedule_time: str) -> CtrConfig:
    """A daily run's config with its day set: the ``day`` run parameter (``data.day``), else the day the run's
    scheduled time names (``data.day_format``, ``data.day_lag``), else a ConfigError.

    ``schedule_time`` is what KFP put for ``dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER``: a recurring run's
    scheduled time; a run started by hand gets its creation time from a KFP backend that resolves the placeholder,
    and the placeholder itself (or nothing) from one that does not.
    """
    if cfg.data.day is not None:
        return cfg
    if not schedule_time or schedule_time.startswith("{{"):
        raise ConfigError("data.day", None, "the day this run trains", f"data.uri {cfg.data.uri} holds a {{day}} "
                          "placeholder, and a daily run needs its day: set the run's day parameter, or create a "
                          "recurring run (cluster.schedule=...), whose runs take it from their scheduled time")
    try:
        day = scheduled_day(schedule_time, cfg.data.day_format, cfg.data.day_lag)
    except ValueError as err:
        raise ConfigError("data.day", None, "the day this run trains",
                          f"the run's scheduled time {schedule_time!r} is no RFC 3339 time: {err}") from None
    print(f"day '{day}': the run's scheduled time {schedule_time} minus data.day_lag={cfg.data.day_lag} days, "
          f"as data.day_format={cfg.data.day_format}", flush=True)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, day=day))


def trained_day(cfg: CtrConfig) -> Optional[dict]:
    """The checkpoint store's entry of the run's day when it has trained that day already; None when the day comes
    after every day it has trained. ConfigError naming the day when it comes before one of them.

    A local run cannot skip its steps (:func:`day_gated`): there a trained day is a ConfigError too."""
    from components.checkpoint.days import DayLedger, DayOrderError
    from components.checkpoint.store import CheckpointStore

    day = cfg.data.day
    try:
        entry = DayLedger(CheckpointStore(cfg.checkpoint.uri)).check_next(day)
    except DayOrderError as err:
        raise ConfigError("data.day", day, "a day after every day checkpoint.uri has trained", str(err)) from None
    if entry is not None and not day_gated(cfg):
        raise ConfigError("data.day", day, "a day checkpoint.uri has not trained yet (a local run cannot skip its "
                          "steps)", f"day '{day}' is trained already (checkpoint {entry.get('checkpoint')})")
    return entry


class ResolvedRun(NamedTuple):
    """The resolve step's outputs: the effective config, whether the run trains (false: its day is trained
    already, and there is nothing to do), and its checkpoint store's URI (where, on Kubeflow, fit-baseline hands its
    fit to the job training beside it, without taking the whole config and so losing its cache per dataset)."""

    config: dict
    train: bool
    checkpoint_uri: str


def effective_config(config: Any, schedule_time: str = "", **run_parameters: Any) -> ResolvedRun:
    """Apply the run parameters to the compiled-in ``config`` (and a daily run's day: :func:`with_run_day`), check
    the result, print it, return it as a dict with whether the run trains (:func:`trained_day`).

    Raises :class:`ConfigError` (the step fails, naming the key) for a value that cannot work.
    """
    cfg = apply_run_parameters(from_dict(config), **run_parameters)
    daily = is_daily(cfg.data.uri)
    if daily:
        cfg = with_run_day(cfg, schedule_time)
    validate(cfg)
    check_inputs(cfg)
    check_local_host(cfg)
    cfg = check_checkpoint_store(cfg)
    trained = trained_day(cfg) if daily else None
    resolved = config_struct(cfg)
    print("effective config:\n" + OmegaConf.to_yaml(OmegaConf.create(resolved)), flush=True)
    if trained is not None:
        print(f"day '{cfg.data.day}' is trained already (checkpoint {trained.get('checkpoint')}): nothing to do",
              flush=True)
    return ResolvedRun(resolved, trained is None, cfg.checkpoint.uri)
