"""``python -m pipelines.ctr [overrides]``: compose the config with Hydra, run the pipeline, return the objective.

    python -m pipelines.ctr                                  # defaults: synthetic data, 2 servers + 2 workers
    python -m pipelines.ctr experiment=tiny ps=geo           # any group / key override
    python -m pipelines.ctr -m model=dnn,deepfm              # a sweep; each job returns its objective
    python -m pipelines.ctr -m hparams_search=optuna         # an Optuna search (conf/hparams_search/)

    python -m pipelines.ctr +cluster=prod checkpoint.uri=s3://b/ctr cluster.host=https://kubeflow.example.com/pipeline
                                                             # compile for Kubeflow Pipelines and submit a run
                                                             # (cluster.wait=true: wait for it, return its objective)

From Python, :func:`run` takes the composed config and returns a :class:`pipelines.result.RunResult`: the run's
test metrics, its run directory, report and delivered checkpoint (README: the Python API).

Hydra's run directory is the run directory (``run_dir``). An error the user can fix (config, data, checkpoint
store, cluster) is reported in one line, exit status 2; a failed Kubeflow submission likewise, exit status 3
(:mod:`pipelines.errors`).
"""

import math
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from components.config import (ClusterBackend, ConfigError, CtrConfig, ModelName, PipelineRunner, from_dict,
                               register_configs, to_dict)
from components.config_rules import validate
from components.data_prep.input_checks import check_inputs
from components.days import expand_days
from components.ps.tls import tls_on
from components.resolve.step import check_checkpoint_store, check_local_host
from pipelines.errors import reported_in_one_line, run_main
from pipelines.help import register_help
from pipelines.result import RunResult


def run(cfg: DictConfig) -> RunResult:
    """The pipeline's Python entry: validate ``cfg`` (the composed config, as ``python -m pipelines.ctr`` composes
    it), run it on ``cluster.runner`` and return what it measured and made (:class:`pipelines.result.RunResult`:
    the test metrics, ``{}`` when nothing was measured here; the run directory, the report, the delivered
    checkpoint's id).

    A user error raises :class:`components.config.ConfigError` (or another error :func:`pipelines.errors.user_error`
    knows) before anything expensive starts.
    """
    typed = from_dict(cfg)
    on_kubeflow = typed.cluster.runner is PipelineRunner.kubeflow
    # The data and a resume target in the cluster's storage are checked by the run's first step, which
    # holds the cluster's credentials; this machine may have none.
    validate(typed)
    tls_on(typed)  # ps.tls=on where the backend cannot carry it (local, Kubernetes): refused before any work
    if not on_kubeflow:
        check_inputs(typed)
    exposed = check_local_host(typed)
    if exposed:
        print(exposed, flush=True)
    check_local_workers_device(typed)
    check_network(typed)
    if typed.plan:
        return print_plan(typed)
    if on_kubeflow:
        from pipelines.kubeflow import run_kubeflow

        return run_kubeflow(typed)
    from pipelines.local import local_config, run_pipeline_locally

    typed = local_config(typed)
    typed = check_checkpoint_store(typed)  # the checkpoint it names is the one every step starts from
    run_dir = Path(typed.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(typed))))
    if typed.data.days is not None:
        from pipelines.days import run_days_locally

        return run_days_locally(typed)
    return run_pipeline_locally(typed)


def check_network(cfg: CtrConfig) -> None:
    """A network of the user's (``model=custom``) imports here as it must in every process, before any work."""
    if cfg.model.name is not ModelName.custom:
        return
    from components.networks.models import load_network

    try:
        load_network(cfg.model.network)
    except ValueError as err:
        raise ConfigError("model.network", cfg.model.network, "an importable 'package.module:function'",
                          str(err)) from None


def check_local_workers_device(cfg: CtrConfig) -> None:
    """Local workers asked to train on a GPU (``cluster.workers.gpus``) run this machine's Paddle: refuse a build
    that cannot (the worker's own check, :func:`components.ps.role.worker_place`) before data prep, in one line."""
    if cfg.cluster.backend is not ClusterBackend.local or cfg.cluster.workers.gpus <= 0:
        return
    from components.ps.role import check_worker_device

    check_worker_device(cfg)


def print_plan(cfg: CtrConfig) -> RunResult:
    """``plan=true``: print what the run would do, start nothing, write nothing; measures nothing."""
    from pipelines.local import local_config
    from pipelines.plan import plan_lines_of

    if cfg.cluster.runner is PipelineRunner.local:
        cfg = check_checkpoint_store(local_config(cfg), probe=False)
    run_dir = Path(cfg.run_dir)  # the run's, not a planned day's (days/<day>/, which a plan never makes)
    planned: Optional[CtrConfig] = cfg
    days_lines: list[str] = []
    if cfg.data.days is not None:
        planned, days_lines = _first_day_to_train(cfg)
    if planned is not None:
        days_lines += plan_lines_of(planned)
    print("\n".join(days_lines), flush=True)
    _remove_empty_run_dir(run_dir)
    return RunResult(metrics={}, run_dir=run_dir)


def _first_day_to_train(cfg: CtrConfig) -> tuple[Optional[CtrConfig], list[str]]:
    """A daily run's plan is its first untrained day's (the later days' differ only in their data): that day's
    config (None when every day is trained) and the line saying which days the store has and which it would train.
    On Kubeflow the store is the cluster's, read by the run itself: every day is planned as untrained."""
    from pipelines.days import day_config, plan_days

    if cfg.cluster.runner is PipelineRunner.local:
        done, todo = plan_days(cfg)
    else:
        done, todo = [], expand_days(cfg.data.days or [])
    line = f"days: {len(done)} of data.days trained already, {len(todo)} to train {todo}"
    if not todo:
        return None, [line + ": nothing to do"]
    return day_config(cfg, todo[0]), [line + f"; the plan of day {todo[0]!r} (each later day's is alike):"]


def _remove_empty_run_dir(run_dir: Path) -> None:
    """Remove the run directory Hydra made for a plan (empty: conf/config.yaml gives a plan no ``.hydra/`` and
    no log file) and the dated directories above it that it leaves empty, up to the working directory."""
    stop = Path.cwd().resolve()
    for directory in (run_dir.resolve(), *run_dir.resolve().parents):
        if directory == stop or not directory.is_dir() or any(directory.iterdir()):
            return
        directory.rmdir()


register_configs()
register_help()
if not OmegaConf.has_resolver("ctr_unless_plan"):  # conf/config.yaml: what plan=true must not write
    OmegaConf.register_new_resolver("ctr_unless_plan", lambda plan, value, otherwise: otherwise if plan else value)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    """The objective (``cfg.objective`` of the test metrics; NaN when nothing was measured): what a sweeper ranks."""
    from pipelines.sweep import in_sweep, run_sweep_job

    if in_sweep():  # one job of a -m sweep: a failure is recorded, and the sweep goes on
        return run_sweep_job(cfg, objective_of_run)
    # Here, not only around the whole command: Hydra adds a line of its own to an error raised out of a job.
    with reported_in_one_line():
        return objective_of_run(cfg)


def objective_of_run(cfg: DictConfig) -> float:
    """:func:`run`'s ``cfg.objective`` metric; NaN when it measured none."""
    metrics = run(cfg).metrics
    return float(metrics[cfg.objective]) if metrics else math.nan


def cli() -> None:
    """The ``ctr`` console script: ``ctr [overrides...]`` is ``python -m pipelines.ctr [overrides...]``."""
    run_main(main)


if __name__ == "__main__":
    cli()
