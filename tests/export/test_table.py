"""A checkpoint's sparse table read one shard at a time: from the servers' text shard files (plain or .gz), or from
the workers' rows in export/embedding.npz; every file checked, every row in its shard."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from components.checkpoint import format as ckpt_io
from components.config import SparseRule
from components.data_prep.prepare import prepare_synthetic
from components.export.table import CheckpointTable
from tests.conftest import commit_staged_checkpoint
from tests.export.checkpoints import (SHARD_NUM, TABLE_DIR, VOCAB, commit_checkpoint, make_checkpoint,
                                      write_shard_file)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("table") / "data"
    prepare_synthetic(out, rows=600, test_fraction=0.25, num_shards=1, vocab_size=VOCAB, seed=5)
    return out


@pytest.mark.parametrize("form", ["text", "gz", "workers"])
def test_every_shard_comes_one_at_a_time_with_its_rows_sorted(data_dir, tmp_path, form):
    checkpoint = make_checkpoint(data_dir, "dnn", rule="adam")
    ckpt = commit_checkpoint(tmp_path / "checkpoint", checkpoint, rows_from_workers=form == "workers",
                             gzip_tables=form == "gz")
    table = CheckpointTable(ckpt)
    assert table.shard_num == SHARD_NUM
    shards = list(table.shards())
    assert [shard.index for shard in shards] == list(range(SHARD_NUM))
    for shard in shards:
        mine = checkpoint.ids % np.uint64(SHARD_NUM) == np.uint64(shard.index)
        assert shard.ids.dtype == np.uint64 and shard.rows.dtype == np.float32
        assert np.array_equal(shard.ids, checkpoint.ids[mine]) and np.array_equal(shard.rows, checkpoint.rows[mine])
    ids, rows = table.whole()
    assert np.array_equal(ids, checkpoint.ids) and np.array_equal(rows, checkpoint.rows)
    assert set(table.dense()) == set(checkpoint.dense)


def test_table_files_come_through_fetch_and_are_dropped_once_read(data_dir, tmp_path):
    checkpoint = make_checkpoint(data_dir, "dnn")
    ckpt = commit_checkpoint(tmp_path / "checkpoint", checkpoint)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    fetched = []

    def fetch(rel: str) -> Path:
        assert not list(scratch.iterdir())  # the file before was removed once read
        fetched.append(rel)
        return Path(shutil.copyfile(ckpt / rel, scratch / Path(rel).name))

    for shard in CheckpointTable(ckpt, fetch).shards():
        assert shard.index == len(fetched) - 1
    assert fetched == [f"{TABLE_DIR}/part-{s // 2:03d}-{s:05d}" for s in range(SHARD_NUM)]
    assert not list(scratch.iterdir())


def test_an_altered_table_file_is_refused_naming_it(data_dir, tmp_path):
    ckpt = commit_checkpoint(tmp_path / "checkpoint", make_checkpoint(data_dir, "dnn"))
    victim = ckpt / TABLE_DIR / "part-001-00003"
    victim.write_text(victim.read_text().replace("1.5", "2.5", 1))
    shards = CheckpointTable(ckpt).shards()
    assert [next(shards).index for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ckpt_io.CheckpointError, match=f"{victim} is missing or does not match its checksum"):
        next(shards)


def test_a_row_in_the_wrong_shard_or_a_missing_shard_file_is_refused(data_dir, tmp_path):
    meta = make_checkpoint(data_dir, "dnn").meta
    rows = np.ones((1, meta["table"]["embedding_dim"]), np.float32)
    staged = tmp_path / "misplaced"
    for shard in range(SHARD_NUM):
        write_shard_file(staged / TABLE_DIR / f"part-000-{shard:05d}", np.asarray([shard + (shard == 2)], np.uint64),
                         rows, SparseRule.adagrad)
    (staged / ckpt_io.EXPORT).mkdir()
    np.savez(staged / ckpt_io.EXPORT / ckpt_io.DENSE_FILE)
    with pytest.raises(ckpt_io.CheckpointError, match=r"shard 2 of 4\) holds id 3, which belongs to shard 3"):
        list(CheckpointTable(commit_staged_checkpoint(staged, meta)).shards())
    (staged / TABLE_DIR / "part-000-00002").unlink()
    with pytest.raises(ckpt_io.CheckpointError, match=r"holds files for shards \[0, 1, 3\], model.json says "
                                                      "shard_num 4"):
        list(CheckpointTable(commit_staged_checkpoint(staged, meta)).shards())
    no_rows = tmp_path / "no-rows"
    (no_rows / ckpt_io.EXPORT).mkdir(parents=True)
    np.savez(no_rows / ckpt_io.EXPORT / ckpt_io.DENSE_FILE)
    with pytest.raises(ckpt_io.CheckpointError, match="names no sparse_table and there is no export/embedding.npz"):
        list(CheckpointTable(commit_staged_checkpoint(no_rows, {**meta, "sparse_table": None})).shards())
