"""Delta exports: a base, then versions holding only the rows changed since their parent and the ids evicted, on a
chain of checkpoints whose rows change, grow and shrink between versions."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from components.checkpoint import format as ckpt_io
from components.config import ExportDtype
from components.data_prep.prepare import prepare_synthetic
from components.export import sharded
from components.export.delta import apply_shard_delta, diff_shard, rebuilt_shard
from components.export.manifest import MANIFEST, ServingModelError
from components.export.model import InferenceModel
from components.export.sharded import export_sharded
from components.export.shards import ShardLayer
from components.export.single import export_single
from components.export.store import ExportStore
from components.networks.scoring import read_test_split
from tests.export.checkpoints import EMBEDDING_DIM, SHARD_NUM, VOCAB, commit_checkpoint, make_checkpoint

CHANGED, NEW, EVICTED = 40, 30, 20  # rows per version


def evolved(checkpoint: ckpt_io.Checkpoint, seed: int) -> ckpt_io.Checkpoint:
    """The next checkpoint: ``CHANGED`` rows moved, ``NEW`` ids trained for the first time, ``EVICTED`` ids gone
    (three disjoint sets), the dense parameters moved too."""
    rng = np.random.default_rng(seed)
    ids, rows = checkpoint.ids, checkpoint.rows.copy()
    picked = rng.choice(len(ids), CHANGED + EVICTED, replace=False)
    changed, evicted = picked[:CHANGED], picked[CHANGED:]
    rows[changed] += rng.normal(0, 0.05, (CHANGED, EMBEDDING_DIM)).astype(np.float32)
    kept = np.ones(len(ids), bool)
    kept[evicted] = False
    new = rng.choice(np.setdiff1d(np.arange(VOCAB, dtype=np.uint64), ids), NEW, replace=False)
    all_ids = np.concatenate([ids[kept], new])
    all_rows = np.concatenate([rows[kept], rng.normal(0, 0.3, (NEW, EMBEDDING_DIM)).astype(np.float32)])
    order = np.argsort(all_ids)
    dense = {name: (value + rng.normal(0, 0.01, value.shape)).astype(np.float32)
             for name, value in checkpoint.dense.items()}
    return dataclasses.replace(checkpoint, ids=all_ids[order], rows=all_rows[order], dense=dense,
                               meta={**checkpoint.meta, "rows": int(len(all_ids))})


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("delta") / "data"
    prepare_synthetic(out, rows=2000, test_fraction=0.25, num_shards=2, vocab_size=VOCAB, seed=4)
    return out


@pytest.fixture(scope="module")
def chain(data_dir, tmp_path_factory) -> list[tuple[ckpt_io.Checkpoint, Path]]:
    """Four committed checkpoints, each evolved from the one before."""
    root = tmp_path_factory.mktemp("chain")
    checkpoints = [make_checkpoint(data_dir, "deepfm", seed=1)]
    for seed in range(3):
        checkpoints.append(evolved(checkpoints[-1], seed))
    return [(c, commit_checkpoint(root / f"checkpoint-{i}", c)) for i, c in enumerate(checkpoints)]


@pytest.fixture(scope="module")
def store(chain, tmp_path_factory) -> Path:
    """The export store after exporting the chain: version 1 a base, 2-4 deltas."""
    uri = tmp_path_factory.mktemp("exports") / "store"
    for _, ckpt in chain:
        export_sharded(ckpt, str(uri), base_every=8)
    return uri


def _manifest(store: Path, version: int) -> dict:
    return json.loads((store / f"v{version:06d}" / MANIFEST).read_text())


def test_each_version_after_the_base_is_a_delta_on_the_one_before(store):
    manifests = [_manifest(store, v) for v in (1, 2, 3, 4)]
    assert [(m["kind"], m["version"], m["parent"], m["chain"]) for m in manifests] == [
        ("base", 1, None, [1]), ("delta", 2, 1, [1, 2]), ("delta", 3, 2, [1, 2, 3]), ("delta", 4, 3, [1, 2, 3, 4])]
    for m in manifests[1:]:
        assert (m["written_rows"], m["removed_rows"]) == (CHANGED + NEW, EVICTED)
        assert all({"ids", "rows", "tombstones"} <= entry.keys() for entry in m["shards"])


def test_base_and_deltas_rebuild_the_full_export_of_the_last_checkpoint_exactly(chain, store, tmp_path):
    last, last_ckpt = chain[-1]
    full = tmp_path / "full"
    export_sharded(last_ckpt, str(full), base_every=0)
    exports = ExportStore(str(store))
    manifests = [exports.manifest(v) for v in (1, 2, 3, 4)]
    for shard in range(SHARD_NUM):
        ids, rows = rebuilt_shard(exports, manifests, shard)
        mine = last.ids % np.uint64(SHARD_NUM) == np.uint64(shard)
        assert np.array_equal(ids, last.ids[mine]) and np.array_equal(rows, last.rows[mine])
        entry = _manifest(full, 1)["shards"][shard]
        assert np.array_equal(ids, np.load(full / "v000001" / entry["ids"]))
        assert np.array_equal(rows, np.load(full / "v000001" / entry["rows"]))


def test_applying_deltas_to_a_loaded_model_equals_loading_the_latest(chain, store, data_dir, tmp_path):
    model = InferenceModel.load(store / "v000001")
    for version in (2, 3, 4):
        model.apply_delta(store / f"v{version:06d}")
    latest = InferenceModel.load(store)
    assert model.version == latest.version == 4
    _, dense, sparse = read_test_split(data_dir)
    assert np.array_equal(model.predict(dense, sparse), latest.predict(dense, sparse))
    single = InferenceModel.load(export_single(chain[-1][1], tmp_path / "single"))
    assert np.max(np.abs(latest.predict(dense, sparse) - single.predict(dense, sparse))) <= 1e-6
    # Evicted ids now have the zero row, new and changed ones their latest rows.
    last, first = chain[-1][0], chain[0][0]
    asked = np.union1d(first.ids, last.ids)
    expected = np.zeros((len(asked), EMBEDDING_DIM), np.float32)
    expected[np.searchsorted(asked, last.ids)] = last.rows
    assert np.array_equal(model.table.lookup(asked), expected)
    assert np.array_equal(latest.table.lookup(asked), expected)


def test_a_delta_whose_parent_is_not_the_loaded_version_is_refused_in_one_line(store):
    model = InferenceModel.load(store / "v000001")
    with pytest.raises(ServingModelError) as refused:
        model.apply_delta(store / "v000003")
    message = str(refused.value)
    assert "\n" not in message and "delta version 3 applies to version 2, the loaded model is version 1" in message
    with pytest.raises(ServingModelError, match="is not a delta"):
        model.apply_delta(store / "v000001")
    assert model.version == 1  # a refused delta changes nothing
    model.apply_delta(store / "v000002")
    assert model.version == 2


def test_a_delta_copied_out_of_the_store_loads_its_chain_from_there(store, data_dir, tmp_path):
    copy = tmp_path / "serving_model"
    shutil.copytree(store / "v000004", copy)
    _, dense, sparse = read_test_split(data_dir)
    model = InferenceModel.load(copy)
    assert model.version == 4 and model.root == copy
    assert np.array_equal(model.predict(dense, sparse), InferenceModel.load(store).predict(dense, sparse))


def test_a_new_base_every_base_every_deltas(chain, tmp_path):
    for base_every, kinds in ((2, ["base", "delta", "delta", "base"]), (0, ["base"] * 4)):
        uri = str(tmp_path / f"every-{base_every}")
        assert [export_sharded(ckpt, uri, base_every=base_every)["kind"] for _, ckpt in chain] == kinds
    # A layout the parent does not share (here the rows' dtype) cannot be compared: a base.
    uri = str(tmp_path / "dtype")
    export_sharded(chain[0][1], uri)
    assert export_sharded(chain[1][1], uri, ExportDtype.float16)["kind"] == "base"
    assert export_sharded(chain[2][1], uri, ExportDtype.float16)["kind"] == "delta"
    with pytest.raises(ValueError, match="export.base_every must be >= 0"):
        export_sharded(chain[3][1], uri, base_every=-1)


def test_a_failed_export_leaves_no_half_written_version(chain, tmp_path, monkeypatch):
    uri = tmp_path / "store"
    export_sharded(chain[0][1], str(uri))
    write_shard = sharded.write_shard

    def failing(root, index, *args):
        if index == 2:
            raise OSError("disk full")
        return write_shard(root, index, *args)

    monkeypatch.setattr(sharded, "write_shard", failing)
    with pytest.raises(OSError, match="disk full"):
        export_sharded(chain[1][1], str(uri))
    assert sorted(p.name for p in uri.iterdir()) == ["v000001"]  # nothing staged left, no version 2
    monkeypatch.setattr(sharded, "write_shard", write_shard)
    assert export_sharded(chain[1][1], str(uri))["version"] == 2


def test_a_store_on_another_filesystem(chain, store, data_dir, tmp_path):
    """Any fsspec URL: versions are uploaded with serving.json last, and read back through downloads."""
    uri = f"memory://exports-{tmp_path.name}/store"
    for _, ckpt in chain[:3]:
        export_sharded(ckpt, uri)
    exports = ExportStore(uri)
    assert exports.versions() == [1, 2, 3]
    assert ExportStore(exports.manifest(3)["store"]).versions() == [1, 2, 3]  # the store a delta names is this one
    _, dense, sparse = read_test_split(data_dir)
    model = InferenceModel.load(uri, cache_dir=tmp_path / "cache")
    assert model.version == 3 and sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        "v000001", "v000002", "v000003"]
    local = InferenceModel.load(store / "v000001")
    local.apply_delta(store / "v000002")
    local.apply_delta(store / "v000003")
    assert np.array_equal(model.predict(dense, sparse), local.predict(dense, sparse))
    assert InferenceModel.load(uri).version == 3  # into a temporary directory of its own


def test_diff_and_apply_are_exact_bit_for_bit():
    rng = np.random.default_rng(0)
    parent_ids = np.arange(0, 40, 2, dtype=np.uint64)
    parent_rows = rng.normal(size=(20, 3)).astype(np.float16)
    parent_rows[4, 1] = np.nan  # id 8: NaN is not equal to itself, but its bits are: unchanged
    parent_rows[10, 1] = 0.0
    ids = np.concatenate([parent_ids[2:], [41, 43]]).astype(np.uint64)  # 0 and 2 evicted, 41 and 43 new
    rows = np.concatenate([parent_rows[2:], rng.normal(size=(2, 3)).astype(np.float16)])
    rows[5, 0] = -rows[5, 0]  # id 14 changed
    rows[8, 1] = -0.0  # id 20: equal as a number, another bit pattern: written, so the rebuild is bit for bit
    new_ids, new_rows, tombstones = diff_shard(parent_ids, parent_rows, ids, rows)
    assert new_ids.tolist() == [14, 20, 41, 43] and tombstones.tolist() == [0, 2]
    got_ids, got_rows = apply_shard_delta(parent_ids, parent_rows, ShardLayer(new_ids, new_rows, tombstones))
    assert np.array_equal(got_ids, ids) and np.array_equal(got_rows.view(np.uint16), rows.view(np.uint16))
