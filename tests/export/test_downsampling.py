"""The correction for negative downsampling in every program that delivers a probability: a checkpoint trained on
negatives kept at rate ``w`` serves ``sigmoid(logit + ln w)``, then its calibration."""

import dataclasses
import math

import numpy as np
import pytest

from components.data_prep.prepare import prepare_synthetic
from components.export.model import InferenceModel
from components.export.sharded import export_sharded
from components.export.single import export_single
from components.networks.scoring import Scorer, corrected_probability, read_test_split
from tests.conftest import calibrated_reference
from tests.export.checkpoints import CALIBRATION, commit_checkpoint, make_checkpoint

RATE = 0.25


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("downsampled") / "data"
    prepare_synthetic(out, rows=600, test_fraction=0.5, num_shards=1, vocab_size=5000, seed=4)
    return out


def _logit(prob):
    prob = np.asarray(prob, np.float64)
    return np.log(prob) - np.log1p(-prob)


@pytest.mark.parametrize("calibration", [None, CALIBRATION])
def test_the_served_probability_is_the_corrected_logits_then_the_calibration(data_dir, tmp_path, calibration):
    checkpoint = make_checkpoint(data_dir, "deepfm")
    checkpoint.meta.update(calibration=calibration, negative_sample_rate=RATE)
    _, dense, sparse = read_test_split(data_dir)
    # The network's own probability, from a program that knows no rate (a checkpoint made before it was recorded).
    unrecorded = {key: value for key, value in checkpoint.meta.items() if key != "negative_sample_rate"}
    uncorrected = Scorer(dataclasses.replace(checkpoint, meta=unrecorded)).predict(dense, sparse)
    corrected = 1 / (1 + np.exp(-(_logit(uncorrected) + math.log(RATE))))
    expected = calibrated_reference(corrected, calibration) if calibration else corrected
    assert not np.allclose(expected, uncorrected, atol=1e-3)  # the premise: the correction moves predictions
    np.testing.assert_allclose(corrected_probability(uncorrected, RATE), corrected, rtol=1e-12)
    ckpt = commit_checkpoint(tmp_path / "checkpoint", checkpoint)
    export_sharded(ckpt, str(tmp_path / "store"))
    served = {"single": InferenceModel.load(export_single(ckpt, tmp_path / "single")),
              "sharded": InferenceModel.load(tmp_path / "store")}
    for fmt, model in served.items():
        np.testing.assert_allclose(model.predict(dense, sparse), expected, rtol=2e-5, atol=1e-7, err_msg=fmt)
        assert model.meta["negative_sample_rate"] == RATE
        assert model.meta["correction"] == "logit + ln(negative_sample_rate)"
    # Evaluation's scorer of the checkpoint applies the same, and keeps the corrected, uncalibrated one beside it.
    delivered, uncalibrated = Scorer(checkpoint, calibrated=True).predict_with_uncalibrated(dense, sparse)
    np.testing.assert_allclose(delivered, expected, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(uncalibrated, corrected, rtol=2e-5, atol=1e-7)
