"""The baseline a local train step fits beside its job (kfp.local runs one task at a time): components.train.fit_beside."""

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from components.checkpoint import format as ckpt_io
from components.checkpoint.store import CheckpointStore
from components.config import from_dict
from components.data_prep.prepare import prepare_synthetic
from components.evaluate.baseline_step import fit_baseline
from components.networks import models
from components.networks.baseline_handoff import FAILED_FILE, READY_FILE
from components.storage import Storage
from components.train.fit_beside import LOG_FILE, fitting_beside
from components.train.step import Baseline, launch_ps_job

ROWS, FEATURES = 4_000, 1 << 12


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    data = tmp_path_factory.mktemp("fit-beside") / "data"
    prepare_synthetic(data, rows=6_000, test_fraction=0.2, valid_fraction=0.2, num_shards=2, vocab_size=1 << 16,
                      seed=4)
    return data


def _children() -> set[int]:
    """This process's children that are alive."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def test_the_train_step_fits_the_baseline_beside_its_job_which_judges_and_keeps_every_checkpoint_with_it(
        tmp_path, data):
    cfg = from_dict({"ps": {"servers": 1, "workers": 2, "epochs": 2, "batch_size": 64},
                     "eval": {"baseline_rows": ROWS, "baseline_features": FEATURES},
                     "checkpoint": {"uri": str(tmp_path / "ckpt"), "keep_last": 5}, "run_dir": str(tmp_path)})
    baseline = Baseline.fitted_beside(cfg, str(tmp_path / "cache"), str(data), here=True)
    said = []
    before = _children()
    result = launch_ps_job(cfg, data, tmp_path / "logs", echo=said.append, baseline=baseline)
    assert _children() <= before  # nothing of the fit is left running
    assert any(line.startswith("== baseline for the blend: fitting beside the job") for line in said)
    assert any(line.startswith("== baseline for the blend: fitted beside the job in") for line in said)
    assert (tmp_path / "logs" / LOG_FILE).is_file()
    # The published fit is the fit of the data, the one every checkpoint was judged with and keeps.
    fit_baseline(data, ROWS, FEATURES, tmp_path / "refit")
    published = Storage(baseline.uri)
    assert published.read_json(None, READY_FILE)["fit"] == json.loads((tmp_path / "refit" / "baseline.json").read_text())
    expected = models.baseline_values(str(tmp_path / "refit"))
    store = CheckpointStore(cfg.checkpoint.uri)
    assert [c["epoch"] for c in result.checkpoints] == [1, 2]
    for event in result.checkpoints:
        local = store.download(event["id"], tmp_path / "got" / event["id"])
        assert json.loads((local / ckpt_io.MODEL_META).read_text())["calibration"]["method"] == "blend"
        with np.load(local / ckpt_io.EXPORT / ckpt_io.DENSE_FILE) as saved:
            for name, value in expected.items():
                np.testing.assert_array_equal(saved[name], value)
    # The fit-baseline step after it takes the published fit instead of fitting again.
    taken = fit_baseline(data, ROWS, FEATURES, tmp_path / "step", handoff=baseline.uri)
    assert taken == json.loads((tmp_path / "refit" / "baseline.json").read_text())
    assert (tmp_path / "step" / "baseline.npz").read_bytes() == (tmp_path / "refit" / "baseline.npz").read_bytes()


def test_a_fit_published_already_is_not_fitted_again(tmp_path, data):
    handoff = str(tmp_path / "cache" / "key")
    fit_baseline(data, ROWS, FEATURES, tmp_path / "first", handoff=handoff)
    said = []
    before = _children()
    with fitting_beside(data, ROWS, FEATURES, handoff, tmp_path / "work", tmp_path / "logs", said.append):
        assert _children() == before
    assert said == [f"== baseline for the blend: fitted already, published at {handoff}"]
    assert not (tmp_path / "logs" / LOG_FILE).exists()


def test_a_fit_killed_without_a_word_is_published_as_failed_for_the_waiting_workers(tmp_path, data):
    handoff = str(tmp_path / "cache" / "key")
    before = _children()
    with fitting_beside(data, ROWS, FEATURES, handoff, tmp_path / "work", tmp_path / "logs", lambda line: None):
        (fit,) = _children() - before
        os.kill(fit, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while Storage(handoff).read_json(None, FAILED_FILE) is None and time.monotonic() < deadline:
            time.sleep(0.05)
    failed = Storage(handoff).read_json(None, FAILED_FILE)
    assert failed["error"].startswith("the fit was killed by SIGKILL (")
    assert failed["error"].endswith(f"its log: {tmp_path / 'logs' / LOG_FILE}")
    assert Storage(handoff).read_json(None, READY_FILE) is None


def test_a_fit_that_outlives_the_job_is_stopped_with_it(tmp_path, data):
    before = _children()
    with fitting_beside(data, ROWS, FEATURES, str(tmp_path / "cache" / "key"), tmp_path / "work", tmp_path / "logs",
                        lambda line: None):
        assert len(_children() - before) == 1
    assert _children() == before
    assert Storage(str(tmp_path / "cache" / "key")).read_json(None, FAILED_FILE) is None  # stopped, not failed
