"""Hydra multirun sweeps: the summary (unit), and real sweeps of the whole local pipeline on tiny data."""

import csv
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from pipelines.sweep import rank, sweep_checkpoint_uri, write_summary

# Without the evaluation's logistic-regression baseline: a sweep ranks its jobs on the model's own metrics.
TINY = ("experiment=tiny", "ps.epochs=1", "eval.baseline=false")


def _record(job, objective, overrides, status="completed", error=""):
    metrics = {"auc": objective, "logloss": 0.5} if objective is not None else {}
    return {"job": job, "status": status, "overrides": overrides, "objective": objective, "metrics": metrics,
            "seconds": 1.0, "dir": f"/sweep/{job}", "error": error, "kubeflow_run_id": "", "kubeflow_url": ""}


def test_summary_ranks_best_first_and_failed_last(tmp_path):
    records = [_record(0, 0.71, ["model=dnn", "ps.epochs=1"]),
               _record(1, None, ["model=wide_deep", "ps.epochs=1"], "failed", "PipelineRunError: train failed"),
               _record(2, 0.74, ["model=deepfm", "ps.epochs=1"])]
    markdown = write_summary(tmp_path, records, "auc")
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["rank"], r["status"]) for r in rows] == [("2", "1", "completed"), ("0", "2", "completed"),
                                                                  ("1", "", "failed")]
    assert rows[0]["model"] == "deepfm" and "ps.epochs" not in rows[0]  # shared overrides are stated once
    assert rows[2]["error"] == "PipelineRunError: train failed"
    assert "3 job(s), 2 completed, 1 failed" in markdown and "Every job: `ps.epochs=1`" in markdown
    assert (tmp_path / "summary.png").stat().st_size > 0
    # logloss is minimised: the lower value ranks first
    assert [r["job"] for r in rank([_record(0, 0.45, []), _record(1, 0.40, [])], "logloss")] == [1, 0]


def test_remote_checkpoint_stores_are_per_sweep_job():
    assert sweep_checkpoint_uri("s3://b/ctr/", "multirun/2026-11-29/18-59-01", 3) == "s3://b/ctr/2026-11-29_18-59-01/3"
    assert sweep_checkpoint_uri("checkpoint", "multirun/2026-11-29/18-59-01", 3) == "checkpoint"  # under the job dir


def _sweep(tmp_path, *overrides):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "pipelines.ctr", "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    rows = []
    if (sweep_dir / "summary.csv").exists():
        with open(sweep_dir / "summary.csv") as f:
            rows = list(csv.DictReader(f))
    return done, sweep_dir, rows


@pytest.mark.slow  # its fast twin: test_a_failed_job_is_recorded_and_the_sweep_goes_on, one job trained, not two
def test_local_sweep_runs_every_job_and_writes_the_summary(tmp_path):
    done, sweep_dir, rows = _sweep(tmp_path, *TINY, "table.embedding_dim=4,8")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(r["table.embedding_dim"] for r in rows) == ["4", "8"]
    for row in rows:
        metrics = json.loads((sweep_dir / row["job"] / "metrics.json").read_text())
        assert row["status"] == "completed" and float(row["objective (auc)"]) == pytest.approx(metrics["auc"], abs=1e-4)
    assert float(rows[0]["auc"]) >= float(rows[1]["auc"])
    assert (sweep_dir / "summary.png").exists() and "# Sweep summary: 2 job(s)" in done.stdout


def test_a_failed_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    """Also the default suite's real sweep of the local pipeline (the two-job one above is slow): every job of the
    sweep runs, each overridden value reaches its row, a completed job's objective is its metrics.json's."""
    # The servers cannot be up within a millisecond: job 0's train step fails; job 1 trains.
    done, sweep_dir, rows = _sweep(tmp_path, *TINY, "ps.startup_timeout_s=0.001,120")
    assert done.returncode == 1  # after the summary: not every job completed
    by_job = {r["job"]: r for r in rows}
    assert sorted(by_job) == ["0", "1"] and [by_job[j]["ps.startup_timeout_s"] for j in "01"] == ["0.001", "120"]
    assert by_job["0"]["status"] == "failed" and "startup_timeout_s" in by_job["0"]["error"]
    assert by_job["1"]["status"] == "completed" and float(by_job["1"]["auc"]) > 0.5
    metrics = json.loads((sweep_dir / "1" / "metrics.json").read_text())
    assert float(by_job["1"]["objective (auc)"]) == pytest.approx(metrics["auc"], abs=1e-4)
    assert "startup_timeout_s" in (sweep_dir / "0" / "error.txt").read_text()
    assert "1 completed, 1 failed" in (sweep_dir / "summary.md").read_text()
    assert (sweep_dir / "summary.png").exists() and "# Sweep summary: 2 job(s)" in done.stdout


def test_optuna_search_runs_locally(tmp_path):
    done, sweep_dir, rows = _sweep(tmp_path, "hparams_search=optuna", *TINY, "hydra.sweeper.n_trials=2",
                                   "hydra.sweeper.sampler.n_startup_trials=2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(rows) == 2 and all(r["status"] == "completed" for r in rows)
    # The sampled values reached the jobs' configs, and Optuna's best is the summary's first row.
    for row in rows:
        job_config = yaml.safe_load((sweep_dir / row["job"] / "config.yaml").read_text())
        assert job_config["table"]["embedding_dim"] == int(row["table.embedding_dim"])
        assert job_config["model"]["learning_rate"] == pytest.approx(float(row["model.learning_rate"]))
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(float(rows[0]["objective (auc)"]), abs=1e-4)


def test_an_optuna_search_in_the_wrong_direction_is_refused(tmp_path):
    done, sweep_dir, rows = _sweep(tmp_path, "hparams_search=optuna", "objective=logloss", "hydra.sweeper.n_trials=1")
    assert done.returncode == 1
    assert rows[0]["status"] == "failed" and "hydra.sweeper.direction" in rows[0]["error"]
    assert not (sweep_dir / "0" / "kfp").exists()  # refused before the pipeline started


def test_a_sweep_over_model_keys_prepares_the_data_once(tmp_path):
    done, sweep_dir, rows = _sweep(tmp_path, *TINY, "model=dnn,deepfm")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [row["status"] for row in rows] == ["completed", "completed"]
    # kfp.local's step cache, shared by the sweep's jobs: the second job reuses the first one's prepared dataset.
    datasets = sorted(sweep_dir.glob("*/kfp/*/merge-data/dataset/stats.json"))
    assert [path.relative_to(sweep_dir).parts[0] for path in datasets] == ["0"]
    second = (sweep_dir / "1" / "ctr.log").read_text()
    assert "Task convert-data cache hit" in second and "Task merge-data cache hit" in second
    assert re.search(r"^  merge-data +cached +14,000 train", done.stdout, re.M), done.stdout
    # The baseline both models blend in is fitted once, beside the first job's training, and taken from there by the
    # second's (components.train.fit_beside) and by both fit-baseline steps.
    first = (sweep_dir / "0" / "ctr.log").read_text()
    assert "fitting beside the job" in first and "fitting beside" not in second
    assert "baseline for the blend: fitted already, published at" in second
    assert len(list((sweep_dir / ".kfp-cache" / "baselines").glob("*/READY.json"))) == 1
    assert re.search(r"^  fit-baseline +cached", done.stdout, re.M), done.stdout


@pytest.mark.slow  # its fast twin: test_a_sweep_over_model_keys_prepares_the_data_once (the same cache, one command)
def test_a_rerun_with_only_a_new_learning_rate_reuses_the_prepared_data(tmp_path):
    # Two runs as a user types them, on different days: in their dated run directories (outputs/<date>/<time>, as
    # conf/config.yaml makes them) they share the cache root above the dates, outputs/.kfp-cache.
    runs = {}
    for name, learning_rate in (("2026-12-05/first", "0.001"), ("2026-12-06/again", "0.002")):
        done = subprocess.run([sys.executable, "-m", "pipelines.ctr", *TINY, f"model.learning_rate={learning_rate}",
                               f"hydra.run.dir={tmp_path / 'outputs' / name}"],
                              cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = done.stdout
    log = (tmp_path / "outputs" / "2026-12-06" / "again" / "ctr.log").read_text()
    assert "Task convert-data cache hit" in log and "Task merge-data cache hit" in log
    assert "cache hit" not in (tmp_path / "outputs" / "2026-12-05" / "first" / "ctr.log").read_text()
    again = runs["2026-12-06/again"]
    assert re.search(r"^  merge-data +cached ", again, re.M), again
    assert not re.search(r"^  train\S* +cached ", again, re.M)  # the new learning rate trains again
    assert len(list((tmp_path / "outputs").glob("*/*/kfp/*/merge-data/dataset/stats.json"))) == 1
    assert (tmp_path / "outputs" / ".kfp-cache").is_dir()
