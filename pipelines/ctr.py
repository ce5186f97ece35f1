"""``python -m pipelines.ctr [overrides]``: compose the config with Hydra, run the pipeline, return the objective.

    python -m pipelines.ctr                                  # defaults: synthetic data, 2 servers + 2 workers
    python -m pipelines.ctr experiment=tiny ps=geo           # any group / key override
    python -m pipelines.ctr -m model=dnn,deepfm              # a sweep; each job returns its objective

Hydra's run directory is the run directory (``run_dir``). A config that cannot work is reported in one
line (exit status 2) before any process starts.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from components.config import ClusterBackend, ConfigError, from_dict, register_configs, to_dict, validate

EXIT_CONFIG_ERROR = 2


def run(cfg: DictConfig) -> float:
    """Validate, run on ``cluster.backend``, return the ``objective`` metric of the test split."""
    typed = from_dict(cfg)
    validate(typed)
    if typed.cluster.backend is ClusterBackend.local:
        from pipelines.local import local_config, run_local

        typed = local_config(typed)
        check_restore(typed)
        run_dir = Path(typed.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(typed))))
        metrics = run_local(typed)
    else:  # pragma: no cover - the enum has no other member yet
        raise ConfigError("cluster.backend", typed.cluster.backend.value, "local")
    return float(metrics[typed.objective])


def check_restore(cfg) -> None:
    """A resume or warm-start target that names no committed checkpoint fails here, before anything starts."""
    from components.checkpoint import CheckpointError
    from components.checkpoint_store import CheckpointStore
    from components.train.checkpointing import restore_source

    try:
        restore_source(CheckpointStore(cfg.checkpoint.uri), cfg.checkpoint.resume, cfg.checkpoint.warm_start)
    except CheckpointError as err:
        key, value = (("checkpoint.warm_start", cfg.checkpoint.warm_start) if "warm_start" in str(err)
                      else ("checkpoint.resume", cfg.checkpoint.resume))
        raise ConfigError(key, value, "none, latest or a committed checkpoint id", str(err)) from None


register_configs()


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    try:
        return run(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG_ERROR)


if __name__ == "__main__":
    main()
