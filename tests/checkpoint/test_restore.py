"""What a job starts from: the newest intact checkpoint, checked whole before any work; after a whole-job restart,
its own newest."""

import pytest

from components.checkpoint.format import CheckpointError
from components.checkpoint.restore import STATE_FILE, RestoreTarget, day_restore_target, restart_target, restore_target
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


# -- the target is checked whole before any work (components.checkpoint.verify) ----------------------------------

def _store_of_three(tmp_path, uri=None):
    """A store holding three committed checkpoints of one run (oldest first), each with a table file."""
    store = CheckpointStore(uri or str(tmp_path / "ckpt"))
    staged = tmp_path / "staged"
    (staged / "tables" / "000").mkdir(parents=True, exist_ok=True)
    ids = []
    for epoch in (1, 2, 3):
        (staged / "tables" / "000" / "part-000-00000").write_bytes(bytes(range(256)) * 64 + bytes([epoch]))
        ids.append(_commit(store, staged, epoch, "run-a"))
    return store, ids


def _flip_a_byte(store, ckpt_id, rel):
    path = store.fs_path(ckpt_id, rel)
    data = bytearray(store.fs.cat_file(path))
    data[len(data) // 2] ^= 1
    store.fs.pipe_file(path, bytes(data))


def _truncate(store, ckpt_id, rel):
    path = store.fs_path(ckpt_id, rel)
    data = store.fs.cat_file(path)
    store.fs.pipe_file(path, data[:len(data) // 2])


CORRUPTIONS = {
    # how the newest checkpoint is damaged: (damage, what the warning names)
    "one byte of a table file": (lambda s, i: _flip_a_byte(s, i, "tables/000/part-000-00000"),
                                 "tables/000/part-000-00000 does not match its sha256"),
    "a truncated MANIFEST": (lambda s, i: _truncate(s, i, "MANIFEST.json"), "MANIFEST.json is not valid JSON"),
    "a missing file": (lambda s, i: s.fs.rm_file(s.fs_path(i, STATE_FILE)),
                       "state.json, listed in MANIFEST.json, is missing"),
    "a truncated table file": (lambda s, i: _truncate(s, i, "tables/000/part-000-00000"),
                               "holds 8,192 bytes, MANIFEST.json says 16,385"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
@pytest.mark.parametrize("resume", ["latest", "auto"])
def test_a_corrupt_newest_checkpoint_gives_way_to_the_newest_intact_one_with_one_warning(tmp_path, case, resume):
    store, ids = _store_of_three(tmp_path)
    damage, named = CORRUPTIONS[case]
    damage(store, ids[-1])
    warnings = []
    target = restore_target(store, resume, None, warn=warnings.append)
    assert target == RestoreTarget(store.uri, ids[1], resume=True, shard_num=None)
    [line] = warnings
    assert f"checkpoint {ids[-1]} in {store.display_uri} is corrupt (" in line and named in line
    assert f"resuming from {ids[1]} instead" in line


def test_every_corrupt_checkpoint_skipped_is_named_in_the_one_warning(tmp_path):
    store, ids = _store_of_three(tmp_path)
    for ckpt_id in ids[1:]:
        _flip_a_byte(store, ckpt_id, "tables/000/part-000-00000")
    warnings = []
    assert restore_target(store, "latest", None, warn=warnings.append).id == ids[0]
    [line] = warnings
    assert ids[2] in line and ids[1] in line and f"resuming from {ids[0]}" in line


@pytest.mark.parametrize("resume", ["latest", "auto"])
def test_no_intact_checkpoint_is_an_error_naming_them(tmp_path, resume):
    store, ids = _store_of_three(tmp_path)
    for ckpt_id in ids:
        _flip_a_byte(store, ckpt_id, "tables/000/part-000-00000")
    with pytest.raises(CheckpointError, match="no committed checkpoint there is intact") as err:
        restore_target(store, resume, None, warn=pytest.fail)
    assert all(ckpt_id in str(err.value) for ckpt_id in ids) and "\n" not in str(err.value)


def test_a_corrupt_checkpoint_named_explicitly_is_an_error_not_a_fallback(tmp_path):
    store, ids = _store_of_three(tmp_path)
    _flip_a_byte(store, ids[1], "tables/000/part-000-00000")
    with pytest.raises(CheckpointError, match=f"checkpoint.resume: checkpoint {ids[1]} in .* is corrupt "
                                              r"\(tables/000/part-000-00000 does not match"):
        restore_target(store, ids[1], None, warn=pytest.fail)
    assert restore_target(store, ids[0], None, warn=pytest.fail).id == ids[0]  # an intact one named: no warning


def test_a_warm_start_falls_back_in_its_source_unless_it_names_the_checkpoint(tmp_path):
    source, ids = _store_of_three(tmp_path / "source")
    _flip_a_byte(source, ids[-1], "tables/000/part-000-00000")
    own = CheckpointStore(str(tmp_path / "own"))
    warnings = []
    target = restore_target(own, "auto", source.uri, warn=warnings.append)
    assert target == RestoreTarget(source.uri, ids[1], resume=False, shard_num=None)
    [line] = warnings
    assert f"warm start from {ids[1]} instead" in line
    with pytest.raises(CheckpointError, match=f"checkpoint.warm_start: checkpoint {ids[-1]} .* is corrupt"):
        restore_target(own, "auto", f"{source.uri}#{ids[-1]}", warn=pytest.fail)


def test_a_days_job_falls_back_within_its_day_and_never_past_what_the_day_before_delivered(tmp_path):
    from components.checkpoint.days import DayLedger
    from components.data_prep.distinct import DistinctCounter

    store = CheckpointStore(str(tmp_path / "ckpt"))
    staged = tmp_path / "staged"
    staged.mkdir()
    delivered = _commit(store, staged, 1, "run-a")
    DayLedger(store).record({"day": "0", "checkpoint": delivered}, None, {"C1": DistinctCounter()})
    day_ids = []
    for epoch in (1, 2):
        (staged / STATE_FILE).write_text('{"run_id": "run-b", "day": "1"}')
        day_ids.append(make_id(epoch, 100))
        store.commit(day_ids[-1], store.upload_dir(staged, day_ids[-1]), {})
    _truncate(store, day_ids[1], "MANIFEST.json")
    warnings = []
    assert day_restore_target(store, "1", warn=warnings.append) == day_ids[0]
    assert len(warnings) == 1 and "resuming day '1' from" in warnings[0]
    _truncate(store, day_ids[0], STATE_FILE)  # now none of the day's is intact (and its day unreadable)
    _flip_a_byte(store, delivered, STATE_FILE)
    with pytest.raises(CheckpointError, match=f"checkpoint {delivered} .* is corrupt .* what day '0' delivered"):
        day_restore_target(store, "1", warn=lambda line: None)


def test_a_checkpoint_in_s3_is_checked_whole_too(tmp_path, s3_endpoint):
    store, ids = _store_of_three(tmp_path, s3_endpoint)
    _flip_a_byte(store, ids[-1], "tables/000/part-000-00000")
    warnings = []
    assert restore_target(store, "latest", None, warn=warnings.append).id == ids[1]
    assert len(warnings) == 1 and "does not match its sha256" in warnings[0]


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_restart_verified_by_its_launcher_resumes_the_newest_intact_checkpoint_of_its_run(tmp_path, case):
    """A role killed while it committed, or a disk that altered the newest checkpoint: the restart resumes the one
    before it, with one warning, instead of every attempt restoring the same broken one; with none intact, it starts
    where the first attempt did."""
    store, ids = _store_of_three(tmp_path)
    damage, named = CORRUPTIONS[case]
    damage(store, ids[-1])
    warned = []
    target = restart_target(store, None, 1, shard_num=16, run_id="run-a", verify=True, warn=warned.append)
    assert target == RestoreTarget(store.uri, ids[1], resume=True, shard_num=16)
    assert len(warned) == 1 and ids[-1] in warned[0] and named in warned[0], warned
    assert f"the restart resumes from {ids[1]} instead" in warned[0]
    for ckpt_id in ids[:2]:
        damage(store, ckpt_id)
    assert restart_target(store, None, 1, shard_num=16, run_id="run-a", verify=True, warn=warned.append) is None
    assert "the restart resumes from where the first attempt started instead" in warned[-1]
