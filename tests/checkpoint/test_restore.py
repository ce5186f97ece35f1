"""What a job starts from after a whole-job restart."""

from components.checkpoint.restore import STATE_FILE, RestoreTarget, restart_target
from components.checkpoint.store import CheckpointStore, make_id


def _commit(store, staged, epoch, run_id):
    ckpt_id = make_id(epoch, 100)
    (staged / STATE_FILE).write_text(f'{{"run_id": "{run_id}"}}')
    store.commit(ckpt_id, store.upload_dir(staged, ckpt_id), {})
    return ckpt_id


def test_a_restarted_job_continues_from_its_own_latest_checkpoint(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    staged = tmp_path / "staged"
    staged.mkdir()
    warm = RestoreTarget("s3://other", "w", resume=False, shard_num=8)
    assert restart_target(store, warm, 0, shard_num=16, run_id="run-b") == warm
    assert restart_target(store, warm, 1, shard_num=16, run_id="run-b") == warm  # nothing committed before the failure
    # An earlier run's checkpoint in the same store is not this run's: the restart starts as the first attempt did.
    _commit(store, staged, 5, "run-a")
    assert restart_target(store, warm, 1, shard_num=16, run_id="run-b") == warm
    own = _commit(store, staged, 2, "run-b")
    assert restart_target(store, warm, 0, shard_num=16, run_id="run-b") == warm  # the first attempt starts as configured
    assert restart_target(store, warm, 1, shard_num=16, run_id="run-b") == RestoreTarget(store.uri, own, resume=True,
                                                                                          shard_num=16)
