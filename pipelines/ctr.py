"""``python -m pipelines.ctr [overrides]``: compose the config with Hydra, run the pipeline, return the objective.

    python -m pipelines.ctr                                  # defaults: synthetic data, 2 servers + 2 workers
    python -m pipelines.ctr experiment=tiny ps=geo           # any group / key override
    python -m pipelines.ctr -m model=dnn,deepfm              # a sweep; each job returns its objective
    python -m pipelines.ctr -m hparams_search=optuna         # an Optuna search (conf/hparams_search/)

    python -m pipelines.ctr +cluster=prod checkpoint.uri=s3://b/ctr cluster.host=https://kubeflow.example.com/pipeline
                                                             # compile for Kubeflow Pipelines and submit a run
                                                             # (cluster.wait=true: wait for it, return its objective)

Hydra's run directory is the run directory (``run_dir``). An error the user can fix (config, data, checkpoint
store, cluster) is reported in one line, exit status 2; a failed Kubeflow submission likewise, exit status 3
(:mod:`pipelines.errors`).
"""

import math
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from components.config import CtrConfig, PipelineRunner, from_dict, register_configs, to_dict, validate
from components.resolve.step import check_checkpoint_store, check_local_host
from pipelines.errors import reported_in_one_line, run_main
from pipelines.help import register_help


def run(cfg: DictConfig) -> float:
    """Validate, run on ``cluster.runner``, return the ``objective`` metric of the test split.

    A Kubeflow run is submitted; with ``cluster.wait=true`` its end is awaited and its objective returned,
    else the objective is NaN.
    """
    typed = from_dict(cfg)
    on_kubeflow = typed.cluster.runner is PipelineRunner.kubeflow
    # The data and a resume target in the cluster's storage are checked by the run's first step, which
    # holds the cluster's credentials; this machine may have none.
    validate(typed, check_storage=not on_kubeflow)
    exposed = check_local_host(typed)
    if exposed:
        print(exposed, flush=True)
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
        from pipelines.days import objective_of, run_days_locally

        return objective_of(run_days_locally(typed), typed.objective)
    metrics = run_pipeline_locally(typed)
    return float(metrics[typed.objective])


def print_plan(cfg: CtrConfig) -> float:
    """``plan=true``: print what the run would do, start nothing, write nothing; the objective is NaN."""
    from pipelines.local import local_config
    from pipelines.plan import plan_lines_of

    if cfg.cluster.runner is PipelineRunner.local:
        cfg = check_checkpoint_store(local_config(cfg), probe=False)
    print("\n".join(plan_lines_of(cfg)), flush=True)
    return math.nan


register_configs()
register_help()


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from pipelines.sweep import in_sweep, run_sweep_job

    if in_sweep():  # one job of a -m sweep: a failure is recorded, and the sweep goes on
        return run_sweep_job(cfg, run)
    # Here, not only around the whole command: Hydra adds a line of its own to an error raised out of a job.
    with reported_in_one_line():
        return run(cfg)


if __name__ == "__main__":
    run_main(main)
