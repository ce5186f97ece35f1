"""What a job starts from after a whole-job restart."""

from components.checkpoint.restore import RestoreTarget, restart_target
from components.checkpoint.store import CheckpointStore, make_id


def test_a_restarted_job_continues_from_its_latest_checkpoint(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    warm = RestoreTarget("s3://other", "w", resume=False, shard_num=8)
    assert restart_target(store, warm, 0, shard_num=16) == warm
    assert restart_target(store, warm, 1, shard_num=16) == warm  # nothing committed before the failure
    ckpt_id = make_id(2, 100)
    (tmp_path / "staged").mkdir()
    (tmp_path / "staged" / "x.txt").write_text("x")
    store.commit(ckpt_id, store.upload_dir(tmp_path / "staged", ckpt_id), {})
    assert restart_target(store, warm, 0, shard_num=16) == warm  # the first attempt starts as configured
    assert restart_target(store, warm, 1, shard_num=16) == RestoreTarget(store.uri, ckpt_id, resume=True, shard_num=16)
