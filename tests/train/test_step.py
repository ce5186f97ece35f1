"""Which checkpoint the train step delivers to the evaluation."""

from components.checkpoint.store import CheckpointStore, make_id
from components.train.job import JobResult
from components.train.step import delivered_checkpoint


def _result(*ids):
    return JobResult(epochs=[], seconds=1.0, restored_from=None,
                     checkpoints=[{"id": i, "validation": {"auc": 0.7, "logloss": 0.5}} for i in ids])


def test_a_best_from_before_the_job_that_is_corrupt_now_gives_way_to_the_jobs_last_with_one_warning(tmp_path, capsys):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    staged = tmp_path / "staged"
    (staged / "scores").mkdir(parents=True)
    (staged / "scores" / "test.npz").write_bytes(bytes(range(256)) * 8)
    ids = [make_id(epoch, 0) for epoch in (1, 2)]
    for ckpt_id in ids:
        store.commit(ckpt_id, store.upload_dir(staged, ckpt_id), {})
    store.mark_best(ids[0])
    assert delivered_checkpoint(_result(ids[1]), store) == ids[0]  # intact: the best is delivered
    assert capsys.readouterr().out == ""
    scores = tmp_path / "ckpt" / ids[0] / "scores" / "test.npz"
    scores.write_bytes(b"\xff" + scores.read_bytes()[1:])
    assert delivered_checkpoint(_result(ids[1]), store) == ids[1]
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"warning: checkpoint {ids[0]} in {store.uri} is corrupt (scores/test.npz does not match")
    assert f"delivering {ids[1]}, this job's last checkpoint" in line
