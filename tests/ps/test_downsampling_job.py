"""Negative downsampling end to end: a PS job trained on negatives kept at rate 0.25 predicts, once corrected
(``logit + ln 0.25``, before any post-hoc calibration), the click rate of unsampled test rows, and ranks them about
as well as the same job trained on every row. Both jobs deliver their best pass on the validation split (early
stopping), so that neither is compared under- or over-trained."""

import numpy as np
import pytest

from components.checkpoint import format as ckpt_io
from components.checkpoint.store import CheckpointStore
from components.config import from_dict
from components.data_prep.prepare import prepare_synthetic
from components.data_prep.synthetic import SyntheticSpec
from components.export.table import CheckpointTable
from components.metrics import binary_metrics
from components.networks.scoring import Scorer, read_test_split
from components.train.step import delivered_checkpoint, launch_ps_job

RATE = 0.25
# Ads-like: clicks are rare, so dropping 3 of 4 negatives keeps most of what the rows say. The model is the
# generator's own form (first-order weights, pairwise factors, linear counts) and ids do not collide: a misspecified
# model's best fit moves when negatives weigh less, and then its ranking with it.
SPEC = SyntheticSpec(base_ctr=0.05)


def _train_and_score(tmp_path, rate: float) -> tuple[np.ndarray, np.ndarray, dict]:
    data_dir = tmp_path / f"data-{rate}"
    stats = prepare_synthetic(data_dir, rows=500_000, test_fraction=0.1, valid_fraction=0.1, num_shards=1,
                              vocab_size=1 << 18, seed=3, spec=SPEC, negative_sample_rate=rate)
    cfg = from_dict({"ps": {"servers": 1, "workers": 1, "epochs": 3, "batch_size": 64},
                     "model": {"name": "deepfm", "hidden": [32]}, "table": {"shard_num": 2},
                     "checkpoint": {"uri": str(tmp_path / f"ckpt-{rate}")}, "run_dir": str(tmp_path)})
    store = CheckpointStore(cfg.checkpoint.uri)
    result = launch_ps_job(cfg, data_dir, tmp_path / f"logs-{rate}", echo=lambda line: None, store=store)
    local = store.download(delivered_checkpoint(result, store), tmp_path / f"local-{rate}")
    table = CheckpointTable(local)
    ids, rows = table.whole()
    labels, dense, sparse = read_test_split(data_dir)
    checkpoint = ckpt_io.Checkpoint(meta=table.meta, ids=ids, rows=rows, dense=table.dense())
    return labels, Scorer(checkpoint).predict(dense, sparse), stats


@pytest.mark.slow
def test_a_job_on_downsampled_negatives_is_calibrated_once_corrected_and_ranks_like_the_full_one(tmp_path):
    labels, full, full_stats = _train_and_score(tmp_path, 1.0)
    sampled_labels, sampled, stats = _train_and_score(tmp_path, RATE)
    np.testing.assert_array_equal(sampled_labels, labels)  # the premise: the test split is not sampled
    assert stats["rows"]["train"] < 0.4 * full_stats["rows"]["train"]  # ... and the train split is
    sampled_auc, full_auc = binary_metrics(labels, sampled)["auc"], binary_metrics(labels, full)["auc"]
    # Mean prediction / observed CTR, before any post-hoc calibration: an uncorrected model trained on a quarter of
    # the negatives would predict about 1 / 0.25 times too many clicks.
    sampled_ratio, full_ratio = sampled.mean() / labels.mean(), full.mean() / labels.mean()
    summary = (f"calibration {sampled_ratio:.3f} (unsampled {full_ratio:.3f}), "
               f"AUC {sampled_auc:.4f} (unsampled {full_auc:.4f})")
    assert 0.95 <= sampled_ratio / full_ratio <= 1.05, summary
    assert abs(sampled_auc - full_auc) <= 0.005, summary
