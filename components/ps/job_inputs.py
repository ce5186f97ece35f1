"""What a PS process reads before it starts: its job spec and the config in it (built once, checked), and on a pod
its copies of the prepared dataset's files it reads and of the fitted baseline, and what to restore after a restart.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Optional

from omegaconf.errors import OmegaConfBaseException

from components.checkpoint.restore import restart_target
from components.checkpoint.store import CheckpointStore
from components.config import ConfigError, CtrConfig, from_dict
from components.config_rules import validate
from components.networks import models
from components.ps.checkpointing import SCORED_SPLITS
from components.ps.contract import RESTART_ENV, RUN_ID_ENV, SPEC_ENV, JobSpec
from components.ps.pull_scoring import split_share


def read_job(job_path: Optional[str]) -> tuple[JobSpec, CtrConfig]:
    """The job spec and its validated config; ConfigError when either cannot work."""
    source = job_path or f"${SPEC_ENV}"
    try:
        job = JobSpec.load(job_path)
        cfg = from_dict(job.config)
    except (KeyError, ValueError, TypeError, OSError, OmegaConfBaseException) as err:
        raise ConfigError(source, f"{type(err).__name__}: {err}".strip(),
                          "a job spec (components.ps.contract.JobSpec) whose config this image's schema reads",
                          "the launcher and the role's image must be of the same version") from err
    validate(cfg)
    return job, cfg


def load_job(job_path: Optional[str]) -> tuple[JobSpec, CtrConfig]:
    """The job spec, with the dataset on local disk and what to restore from after a restart, and its config (built
    once, here)."""
    job, cfg = read_job(job_path)
    Path(job.workdir).mkdir(parents=True, exist_ok=True)
    data_dir = job.data_dir
    if "://" in data_dir:
        data_dir = str(fetch_dataset(data_dir, Path(job.workdir) / "data"))
    baseline = job.baseline
    # A baseline fitted beside the job is fetched when it is published (role.Worker._baseline).
    if "://" in baseline and os.environ.get("TRAINING_ROLE") == "TRAINER" and not job.baseline_beside:
        baseline = str(fetch_baseline(baseline, Path(job.workdir) / "baseline"))
    attempt = int(os.environ.get(RESTART_ENV) or 0)
    run_id = os.environ.get(RUN_ID_ENV) or job.run_id
    restore = restart_target(CheckpointStore(cfg.checkpoint.uri), job.restore, attempt, job.plan.shard_num, run_id)
    return dataclasses.replace(job, data_dir=data_dir, restore=restore, run_id=run_id, baseline=baseline), cfg


def fetch_files(uri: str, local: Path, names: list[str]) -> Path:
    """Copies under ``local`` of the files ``names`` (paths relative to the store directory ``uri``)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    for name in names:
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        fs.get(f"{root.rstrip('/')}/{name}", str(local / name))
    return local


def fetch_baseline(uri: str, local: Path) -> Path:
    """A worker's copy of the fitted baseline (the servers hold none of it)."""
    return fetch_files(uri, local, [models.BASELINE_FILE])


def fetch_dataset(uri: str, local: Path) -> Path:
    """A pod's copy of the prepared dataset: stats.json and, for a worker, the train shards it reads and its share of
    the validation and test splits (every worker scores its share of each checkpoint)."""
    fetch_files(uri, local, ["stats.json"])
    if os.environ.get("TRAINING_ROLE") == "TRAINER":
        stats = json.loads((local / "stats.json").read_text())
        index, count = int(os.environ["PADDLE_TRAINER_ID"]), int(os.environ["PADDLE_TRAINERS_NUM"])
        scored = [rel for split in SCORED_SPLITS for rel in split_share(stats, split, index, count)]
        fetch_files(uri, local, stats["shards"]["train"][index::count] + scored)
    return local
