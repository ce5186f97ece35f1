"""The fitted baseline handed to a job training beside its step (components.networks.baseline_handoff)."""

import json
import threading

import numpy as np
import pytest

from components.networks import baseline_handoff
from components.networks.baseline_handoff import (FAILED_FILE, READY_FILE, BaselineUnavailable, clear_failure,
                                                  handoff_uri, publish, publish_failure, take_published,
                                                  wait_for_baseline)
from components.networks.models import BASELINE_FILE, FittedBaseline
from components.storage import Storage

FIT = {"baseline_rows": 1000, "baseline_l2": 30.0, "baseline_l2_chosen_by": "validation logloss of 1,000 rows",
       "baseline_features": 64}


def _fitted(directory, seed=0):
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    FittedBaseline(rng.normal(size=64), rng.normal(size=3), 0.25, -0.5).save(directory)
    return directory


def test_the_step_and_the_job_name_the_same_place_for_the_same_dataset_and_fit_and_no_other():
    uri = handoff_uri("s3://bucket/ckpt/", "minio://kfp/run-1/merge-data/dataset", 1000, 1 << 20)
    assert uri.startswith("s3://bucket/ckpt/baselines/")
    assert uri == handoff_uri("s3://bucket/ckpt", "minio://kfp/run-1/merge-data/dataset", 1000, 1 << 20)
    others = {handoff_uri("s3://bucket/other", "minio://kfp/run-1/merge-data/dataset", 1000, 1 << 20),
              handoff_uri("s3://bucket/ckpt", "minio://kfp/run-2/merge-data/dataset", 1000, 1 << 20),
              handoff_uri("s3://bucket/ckpt", "minio://kfp/run-1/merge-data/dataset", 999, 1 << 20),
              handoff_uri("s3://bucket/ckpt", "minio://kfp/run-1/merge-data/dataset", 1000, 1 << 19)}
    assert uri not in others and len(others) == 4


def test_a_worker_waits_for_the_fit_and_gets_the_very_file(tmp_path, monkeypatch):
    uri = str(tmp_path / "store" / "baselines" / "key")
    fitted = _fitted(tmp_path / "fit")
    said = []
    polls = []

    def poll(seconds):  # the step publishes while the worker waits: after its third look
        polls.append(seconds)
        if len(polls) == 3:
            publish(fitted, Storage(uri), FIT)

    monkeypatch.setattr(baseline_handoff, "_sleep", poll)
    local = wait_for_baseline(Storage(uri), tmp_path / "worker", failed_grace_s=0, say=said.append)
    assert (local / BASELINE_FILE).read_bytes() == (fitted / BASELINE_FILE).read_bytes()
    assert len(polls) == 3 and said == [f"waiting for the baseline fitted beside this job at {uri}"]
    assert json.loads((tmp_path / "store" / "baselines" / "key" / READY_FILE).read_text())["size"] == \
        (fitted / BASELINE_FILE).stat().st_size


def test_a_published_failure_ends_the_wait_with_the_steps_error_unless_a_retry_withdraws_it(tmp_path, monkeypatch):
    uri = str(tmp_path / "store" / "key")
    publish_failure(Storage(uri), "MemoryError: the design matrix")
    monkeypatch.setattr(baseline_handoff, "_sleep", lambda s: None)
    with pytest.raises(BaselineUnavailable, match="baseline's fit beside this job failed: MemoryError: the design"):
        wait_for_baseline(Storage(uri), tmp_path / "worker", failed_grace_s=0)

    # Where the step is retried, the worker waits out the grace: the retry clears the failure when it starts, and
    # publishes.
    clock = [0.0]
    monkeypatch.setattr(baseline_handoff.time, "monotonic", lambda: clock[0])
    fitted = _fitted(tmp_path / "fit")

    def retry(seconds):
        clock[0] += seconds
        if clock[0] == 60:
            clear_failure(Storage(uri))
        if clock[0] == 400:  # beyond the grace counted from the first failure: the clearing restarted it
            publish(fitted, Storage(uri), FIT)

    monkeypatch.setattr(baseline_handoff, "_sleep", retry)
    local = wait_for_baseline(Storage(uri), tmp_path / "worker", failed_grace_s=300, poll_s=20, say=lambda line: None)
    assert (local / BASELINE_FILE).is_file() and not (tmp_path / "store" / "key" / FAILED_FILE).exists()


def test_no_fit_in_time_or_an_altered_file_is_refused_in_one_line(tmp_path, monkeypatch):
    uri = str(tmp_path / "store" / "key")
    clock = [0.0]
    monkeypatch.setattr(baseline_handoff.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(baseline_handoff, "_sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    with pytest.raises(BaselineUnavailable, match=r"no baseline at .* after 30s: .*model.blend_baseline=false") as err:
        wait_for_baseline(Storage(uri), tmp_path / "worker", failed_grace_s=0, timeout_s=30, poll_s=2,
                          say=lambda line: None)
    assert "\n" not in str(err.value)

    publish(_fitted(tmp_path / "fit"), Storage(uri), FIT)
    stored = tmp_path / "store" / "key" / BASELINE_FILE
    stored.write_bytes(stored.read_bytes()[:-1])
    with pytest.raises(BaselineUnavailable, match="is not the file its READY.json names"):
        wait_for_baseline(Storage(uri), tmp_path / "worker", failed_grace_s=0)


def test_the_baseline_step_publishes_its_fit_or_its_failure(tmp_path):
    from components.data_prep.prepare import prepare_synthetic
    from components.evaluate.baseline_step import fit_baseline

    dataset_dir = tmp_path / "data"
    prepare_synthetic(dataset_dir, rows=4_000, test_fraction=0.2, valid_fraction=0.2, num_shards=1,
                      vocab_size=1 << 16, seed=1)
    uri = str(tmp_path / "store" / "key")
    publish_failure(Storage(uri), "an earlier try's")
    fit_baseline(dataset_dir, rows=2_000, features=1 << 12, out_dir=tmp_path / "fit", handoff=uri)
    local = wait_for_baseline(Storage(uri), tmp_path / "worker", failed_grace_s=0)
    assert (local / BASELINE_FILE).read_bytes() == (tmp_path / "fit" / BASELINE_FILE).read_bytes()
    assert not (tmp_path / "store" / "key" / FAILED_FILE).exists()

    broken = str(tmp_path / "store" / "broken")
    with pytest.raises(FileNotFoundError):
        fit_baseline(tmp_path / "no-dataset", rows=2_000, features=1 << 12, out_dir=tmp_path / "x", handoff=broken)
    with pytest.raises(BaselineUnavailable, match="failed: FileNotFoundError: .*stats.json"):
        wait_for_baseline(Storage(broken), tmp_path / "worker-2", failed_grace_s=0)


def test_a_fit_published_by_another_thread_a_moment_later_is_taken(tmp_path):
    """The real clock and sleep: a fit published from another thread a moment later is taken."""
    uri = str(tmp_path / "store" / "key")
    fitted = _fitted(tmp_path / "fit")
    timer = threading.Timer(0.3, publish, (fitted, Storage(uri), FIT))
    timer.start()
    try:
        local = wait_for_baseline(Storage(uri), tmp_path / "worker", failed_grace_s=0, timeout_s=30, poll_s=0.05,
                                  say=lambda line: None)
    finally:
        timer.cancel()
    assert FittedBaseline.load(local).bias == 0.25


def test_the_hand_off_works_through_an_s3_store_as_on_kubeflow(tmp_path, s3_endpoint):
    """On Kubeflow the checkpoint store is an object store: a retried step's failure withdrawn, its fit published
    and taken, byte for byte."""
    uri = handoff_uri(s3_endpoint, "minio://kfp/run/merge-data/dataset", 1000, 1 << 12)
    publish_failure(Storage(uri), "OSError: a lost node")
    with pytest.raises(BaselineUnavailable, match="failed: OSError: a lost node"):
        wait_for_baseline(Storage(uri), tmp_path / "worker", failed_grace_s=0)
    clear_failure(Storage(uri))
    assert not Storage(uri).is_file(None, FAILED_FILE)
    fitted = _fitted(tmp_path / "fit")
    publish(fitted, Storage(uri), FIT)
    local = wait_for_baseline(Storage(uri), tmp_path / "worker", failed_grace_s=0, timeout_s=10, say=lambda line: None)
    assert (local / BASELINE_FILE).read_bytes() == (fitted / BASELINE_FILE).read_bytes()
    # A fit-baseline step that finds it published (a rerun whose cached result expired) takes it, with its facts.
    assert take_published(Storage(uri), tmp_path / "step") == FIT
    assert (tmp_path / "step" / BASELINE_FILE).read_bytes() == (fitted / BASELINE_FILE).read_bytes()
    assert take_published(Storage(handoff_uri(s3_endpoint, "minio://kfp/other", 1000, 1 << 12)), tmp_path / "x") is None
