"""The servable models of both export formats (components.export) and their command line, on real checkpoints
built directly (random but fixed parameters; no PS job; the rows in the servers' text shard files)."""

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

from components.checkpoint import format as ckpt_io
from components.config import ExportDtype
from components.data_prep.hashing import HASH_FUNCTION
from components.data_prep.multislot import RaggedIds, Schema, format_line, read_shards
from components.data_prep.prepare import prepare_synthetic
from components.export.manifest import MANIFEST, ServingModelError, write_manifest
from components.export.model import InferenceModel, ShardedModel, SingleModel
from components.export.serving import main
from components.export.sharded import export_sharded
from components.export.shards import SHARDS
from components.export.single import IDS_FILE, export_single
from components.export.signing import AUTO, signer
from components.export.store import VERSION_NAME, ExportStore
from components.metrics import binary_metrics
from components.networks.scoring import Scorer, read_test_split, row_indices
from tests.conftest import calibrated_reference, score_serving_model
from tests.export.checkpoints import (CALIBRATION, EMBEDDING_DIM, SHARD_NUM, VOCAB, commit_checkpoint,
                                      make_checkpoint)

FAMILIES = ("dnn", "wide_deep", "deepfm", "dcn")
FORMATS = ("single", "sharded")
# float16 keeps 11 significant bits: rounding moves a weight by at most 2**-11 of its value.
FLOAT16_MAX_RELATIVE_ERROR = 2.0 ** -11


@dataclasses.dataclass
class Exported:
    checkpoint: ckpt_io.Checkpoint  # what was committed
    ckpt: Path  # the committed checkpoint directory
    single: Path  # its single-file model
    store: Path  # an export store holding its sharded base, version 1

    def model_path(self, fmt: str) -> Path:
        return self.single if fmt == "single" else self.store


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serving") / "data"
    prepare_synthetic(out, rows=2000, test_fraction=0.25, num_shards=2, vocab_size=VOCAB, seed=3)
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, data_dir, tmp_path_factory) -> Exported:
    """One model family's checkpoint exported in both formats."""
    root = tmp_path_factory.mktemp(request.param)
    checkpoint = make_checkpoint(data_dir, request.param, seed=FAMILIES.index(request.param))
    ckpt = commit_checkpoint(root / "checkpoint", checkpoint)
    export_sharded(ckpt, str(root / "store"))
    return Exported(checkpoint, ckpt, export_single(ckpt, root / "single"), root / "store")


def test_single_export_writes_the_paddle_inference_format(exported):
    serving = exported.single
    assert sorted(p.name for p in serving.iterdir()) == ["ids.npy", "model.pdiparams", "model.pdmodel",
                                                         "serving.json", "serving.json.sig"]
    assert not [p for p in serving.parent.iterdir() if p.name.startswith(".")]  # no staging left behind
    meta = json.loads((serving / MANIFEST).read_text())
    checkpoint = exported.checkpoint
    assert meta["format"] == "single" and sorted(meta["files"]) == ["ids.npy", "model.pdiparams", "model.pdmodel"]
    assert meta["model_name"] == checkpoint.meta["model"]["name"] and meta["schema"] == checkpoint.meta["schema"]
    assert meta["feed_names"] == ["dense", *checkpoint.meta["schema"]["sparse_slots"]]
    assert [feed["name"] for feed in meta["feeds"]] == meta["feed_names"]
    assert meta["paddle_version"] == paddle.__version__
    assert meta["source_checkpoint"]["path"] == str(exported.ckpt.resolve())
    assert meta["table_rows"] == len(checkpoint.ids) + 1 and meta["unseen_row"] == len(checkpoint.ids)
    assert np.array_equal(np.load(serving / IDS_FILE), checkpoint.ids)


def test_sharded_export_writes_a_version_of_id_sorted_shards(exported):
    version = exported.store / VERSION_NAME.format(1)
    assert sorted(p.name for p in exported.store.iterdir()) == ["v000001"]  # no staging left behind
    meta = json.loads((version / MANIFEST).read_text())
    assert (meta["format"], meta["kind"], meta["version"], meta["parent"], meta["chain"]) == ("sharded", "base", 1,
                                                                                             None, [1])
    assert meta["store"] == str(exported.store) and meta["shard_num"] == SHARD_NUM
    slots = exported.checkpoint.meta["schema"]["sparse_slots"]
    assert meta["feed_names"] == ["dense", *[f"{slot}.rows" for slot in slots]]
    assert meta["slot_tables"] == {slot: "embedding" for slot in slots}
    assert (meta["embedding_dim"], meta["embedding_dtype"], meta["hash_function"]) == (EMBEDDING_DIM, "float32",
                                                                                       HASH_FUNCTION)
    assert meta["calibration"] == CALIBRATION and meta["vocab_size"] == VOCAB
    assert meta["source_checkpoint"]["manifest_sha256"] == ckpt_io.file_digest(exported.ckpt / ckpt_io.MANIFEST)[1]
    assert sorted(meta["files"]) == sorted(["model.pdmodel", "model.pdiparams",
                                            *(f"{SHARDS}/{s:05d}.{kind}.npy" for s in range(SHARD_NUM)
                                              for kind in ("ids", "rows"))])
    ids, rows = exported.checkpoint.ids, exported.checkpoint.rows
    assert meta["rows"] == meta["written_rows"] == len(ids) and meta["removed_rows"] == 0
    for shard, entry in enumerate(meta["shards"]):
        mine = ids % np.uint64(SHARD_NUM) == np.uint64(shard)
        assert np.array_equal(np.load(version / entry["ids"]), ids[mine])  # sorted: ids are
        assert np.array_equal(np.load(version / entry["rows"]), rows[mine])
        assert entry["total"] == entry["written"] == mine.sum()


def test_both_formats_predict_like_the_scorer(exported, data_dir):
    labels, dense, sparse = read_test_split(data_dir)
    raw = Scorer(exported.checkpoint).predict(dense, sparse)
    expected = calibrated_reference(raw, CALIBRATION)  # what the served program computes, in float32
    single = InferenceModel.load(exported.single)
    sharded = InferenceModel.load(exported.store)
    assert type(single) is SingleModel and type(sharded) is ShardedModel
    got = single.predict(dense, sparse)
    assert got.shape == expected.shape == labels.shape
    assert np.max(np.abs(got - expected)) < 1e-6 and np.max(np.abs(got - raw)) > 1e-3
    assert np.max(np.abs(sharded.predict(dense, sparse) - got)) <= 1e-6  # the sharded model is the single one
    for path in (exported.single, exported.store):
        scored = score_serving_model(path, data_dir)
        assert np.max(np.abs(scored["preds"] - got)) <= 1e-6
        assert scored["metrics"]["auc"] == pytest.approx(binary_metrics(labels, got)["auc"], abs=1e-9)
    assert len(np.unique(got)) > len(got) // 2  # the model is not a constant


def test_a_paddle_inference_predictor_serves_both_formats(exported, data_dir):
    _, dense, sparse = read_test_split(data_dir)
    n = 300
    expected = InferenceModel.load(exported.single).predict(dense[:n], [_head(slot, n) for slot in sparse])
    assert np.max(np.abs(_paddle_inference_predict(exported.single, dense, sparse, n) - expected)) < 1e-6
    version = exported.store / VERSION_NAME.format(1)
    assert np.max(np.abs(_paddle_inference_predict(version, dense, sparse, n) - expected)) < 1e-6


def _paddle_inference_predict(serving: Path, dense: np.ndarray, sparse: list[RaggedIds], n: int) -> np.ndarray:
    """Another runtime, fed as serving.json says: row indices of ids.npy (single), or the rows themselves, looked
    up in the id-sorted shards (sharded), with one LoD sequence per example."""
    meta = json.loads((serving / MANIFEST).read_text())
    config = paddle.inference.Config(str(serving / meta["model_file"]), str(serving / meta["params_file"]))
    config.disable_gpu()
    config.disable_glog_info()
    predictor = paddle.inference.create_predictor(config)
    assert predictor.get_input_names() == meta["feed_names"]
    handle = predictor.get_input_handle("dense")
    handle.reshape([n, dense.shape[1]])
    handle.copy_from_cpu(np.ascontiguousarray(dense[:n]))
    for name, slot in zip(meta["feed_names"][1:], sparse):
        values = slot.values[:slot.offsets[n]].astype(np.uint64)
        if meta["format"] == "single":
            fed = row_indices(np.load(serving / IDS_FILE), values).reshape(-1, 1)
        else:
            fed = np.zeros((len(values), meta["embedding_dim"]), np.float32)
            for shard, entry in enumerate(meta["shards"]):
                ids, rows = np.load(serving / entry["ids"]), np.load(serving / entry["rows"])
                mine = np.flatnonzero(values % np.uint64(meta["shard_num"]) == np.uint64(shard))
                pos = np.minimum(np.searchsorted(ids, values[mine]), len(ids) - 1)
                found = ids[pos] == values[mine]
                fed[mine[found]] = rows[pos[found]]
        handle = predictor.get_input_handle(name)
        handle.reshape(list(fed.shape))
        handle.copy_from_cpu(fed)
        handle.set_lod([slot.offsets[:n + 1].tolist()])
    predictor.run()
    return predictor.get_output_handle(meta["fetch_names"][0]).copy_to_cpu().ravel()


def _head(slot: RaggedIds, n: int) -> RaggedIds:
    return RaggedIds(slot.values[:slot.offsets[n]], slot.offsets[:n + 1])


def _one_example(slots: list[list[int]], dense_dim: int) -> tuple[np.ndarray, list[RaggedIds]]:
    dense = np.full((1, dense_dim), 0.5, np.float32)
    return dense, [RaggedIds(np.asarray(ids, np.int64), np.asarray([0, len(ids)], np.int64)) for ids in slots]


@pytest.mark.parametrize("fmt", FORMATS)
def test_unseen_ids_score_with_the_zero_row(exported, fmt):
    model = InferenceModel.load(exported.model_path(fmt))
    scorer = Scorer(exported.checkpoint, calibrated=True)  # as served
    ids = exported.checkpoint.ids
    seen = [int(i) for i in ids[: len(model.schema.sparse_slots)]]
    unseen = [VOCAB + 7, VOCAB + 11]  # outside the hashed id range: never trained
    assert not np.isin(np.asarray(unseen, np.uint64), ids).any()
    assert list(row_indices(ids, np.asarray(unseen))) == [len(ids)] * 2
    dim = model.schema.dense_dim
    # Sum pooling over a zero row: an unseen id next to a seen one changes nothing.
    alone = model.predict(*_one_example([[i] for i in seen], dim))
    with_unseen = model.predict(*_one_example([[i, unseen[0]] for i in seen], dim))
    assert np.array_equal(alone, with_unseen)
    # All ids unseen: every unseen id is the same (zero) row, and the Scorer agrees.
    a = model.predict(*_one_example([[unseen[0]]] * len(seen), dim))
    b = model.predict(*_one_example([[unseen[1]]] * len(seen), dim))
    assert np.array_equal(a, b)
    assert np.max(np.abs(a - scorer.predict(*_one_example([[unseen[0]]] * len(seen), dim)))) < 1e-6
    assert np.all((a > 0) & (a < 1))


def test_the_test_split_holds_unseen_ids(exported, data_dir):
    _, _, sparse = read_test_split(data_dir)
    values = np.concatenate([slot.values for slot in sparse]).astype(np.uint64)
    unseen = ~np.isin(values, np.load(exported.single / IDS_FILE))
    assert 0 < unseen.sum() < len(values)


def test_float16_models_predict_like_each_other_and_near_float32(exported, data_dir, tmp_path):
    single16 = export_single(exported.ckpt, tmp_path / "single16", ExportDtype.float16)
    export_sharded(exported.ckpt, str(tmp_path / "store16"), ExportDtype.float16)
    version16, version = tmp_path / "store16" / "v000001", exported.store / "v000001"
    for path in (single16, version16):
        assert json.loads((path / MANIFEST).read_text())["embedding_dtype"] == "float16"
    # The rows are stored float16: the single model's table (rows + the zero row) and each rows shard lose half.
    full = exported.checkpoint
    assert _size(exported.single, "model.pdiparams") - _size(single16, "model.pdiparams") == \
        (len(full.ids) + 1) * EMBEDDING_DIM * 2
    for entry in json.loads((version16 / MANIFEST).read_text())["shards"]:
        assert np.array_equal(np.load(version16 / entry["rows"]), np.load(version / entry["rows"]).astype(np.float16))

    labels, dense, sparse = read_test_split(data_dir)
    expected = InferenceModel.load(exported.single).predict(dense, sparse)
    got = InferenceModel.load(single16).predict(dense, sparse)
    assert np.max(np.abs(InferenceModel.load(tmp_path / "store16").predict(dense, sparse) - got)) <= 1e-6
    # It is the float16 checkpoint's scorer, and another runtime serves it the same.
    half = dataclasses.replace(full, rows=full.rows.astype(np.float16))
    assert np.max(np.abs(got - Scorer(half, calibrated=True).predict(dense, sparse))) < 1e-6
    n = 300
    assert np.max(np.abs(_paddle_inference_predict(single16, dense, sparse, n) - got[:n])) < 1e-6
    assert np.max(np.abs(_paddle_inference_predict(version16, dense, sparse, n) - got[:n])) < 1e-6
    # Tolerance: rounding to float16 moves each weight by at most 2**-11 of its value, so the yardstick is a
    # float32 twin whose every row weight is moved by exactly that much (random signs). Most weights round
    # by less: float16 stayed at 0.3-0.6 of the twin's largest deviation (3 seeds x 3 model families).
    signs = np.random.default_rng(0).choice([-1.0, 1.0], full.rows.shape)
    nudged = dataclasses.replace(full, rows=(full.rows * (1 + FLOAT16_MAX_RELATIVE_ERROR * signs)).astype(np.float32))
    yardstick = np.max(np.abs(Scorer(nudged, calibrated=True).predict(dense, sparse) - expected))
    assert 0 < np.max(np.abs(got - expected)) <= yardstick
    assert binary_metrics(labels, got)["auc"] == pytest.approx(binary_metrics(labels, expected)["auc"], abs=0.002)


def _size(root: Path, rel: str) -> int:
    return (root / rel).stat().st_size


def test_float16_export_refuses_values_it_cannot_hold(data_dir, tmp_path):
    checkpoint = make_checkpoint(data_dir, "dnn")
    checkpoint.rows[3, 1] = 7e4  # float16 ends at 65504
    ckpt = commit_checkpoint(tmp_path / "checkpoint", checkpoint)
    with pytest.raises(ValueError, match="up to 70000 do not fit export.dtype=float16"):
        export_single(ckpt, tmp_path / "single", ExportDtype.float16)
    with pytest.raises(ValueError, match="up to 70000 do not fit export.dtype=float16"):
        export_sharded(ckpt, str(tmp_path / "store"), ExportDtype.float16)
    assert not (tmp_path / "single").exists() and ExportStore(str(tmp_path / "store")).versions() == []
    assert not [p for p in tmp_path.rglob(".*")]  # nothing staged either
    export_sharded(ckpt, str(tmp_path / "store"), ExportDtype.float32)
    assert np.load(tmp_path / "store" / "v000001" / SHARDS / f"{int(checkpoint.ids[3]) % SHARD_NUM:05d}.rows.npy"
                   ).max() == np.float32(7e4)


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_predict_writes_one_probability_per_example(exported, fmt, data_dir, tmp_path, capsys):
    model = exported.model_path(fmt)
    stats = json.loads((data_dir / "stats.json").read_text())
    shards = [data_dir / p for p in stats["shards"]["test"]]
    out = tmp_path / "out" / "preds.txt"
    assert main(["predict", "--model", str(model), "--input", str(data_dir / "test" / "part-*.txt"),
                 "--output", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == stats["rows"]["test"]
    assert f"{len(lines)} predictions from {len(shards)} file(s)" in capsys.readouterr().out
    _, dense, sparse = read_shards(sorted(shards), Schema.from_dict(stats["schema"]))
    expected = InferenceModel.load(model).predict(dense, sparse)
    assert np.array_equal(np.asarray(lines, np.float32), expected)  # %.9g: float32 reads back exactly
    # Files in the order given, each glob's matches sorted.
    reverse = tmp_path / "reverse.txt"
    assert main(["predict", "--model", str(model), "--input", *map(str, sorted(shards)[::-1]),
                 "--output", str(reverse), "--no-verify"]) == 0
    first = sum(1 for _ in open(sorted(shards)[-1]))
    # (a row's float32 result may move in the last bits with its position in the batch)
    assert np.allclose(np.asarray(reverse.read_text().splitlines()[:first], np.float32),
                       np.asarray(lines[-first:], np.float32), rtol=0, atol=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_end_to_end_in_a_fresh_process(data_dir, tmp_path, fmt):
    """``python -m components.export.serving export`` then ``predict`` on new MultiSlot lines, with unseen ids."""
    checkpoint = make_checkpoint(data_dir, "deepfm")
    ckpt = commit_checkpoint(tmp_path / "checkpoint", checkpoint)
    schema = Schema.from_dict(json.loads((data_dir / "stats.json").read_text())["schema"])
    new = tmp_path / "new.txt"
    rng = np.random.default_rng(5)
    new.write_text("".join(
        format_line(0, rng.normal(size=schema.dense_dim).tolist(),
                    [rng.integers(0, 2 * VOCAB, rng.integers(1, 3)).tolist() for _ in schema.sparse_slots], schema)
        + "\n" for _ in range(37)))
    serving, preds = tmp_path / "serving", tmp_path / "preds.txt"
    for args in (["export", "--checkpoint", str(ckpt), "--out", str(serving), "--format", fmt],
                 ["predict", "--model", str(serving), "--input", str(new), "--output", str(preds)]):
        proc = subprocess.run([sys.executable, "-m", "components.export.serving", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("37 predictions from 1 file(s)")
    lines = preds.read_text().splitlines()
    assert len(lines) == 37
    _, dense, sparse = read_shards([new], schema)
    expected = Scorer(checkpoint, calibrated=True).predict(dense, sparse)
    assert np.max(np.abs(np.asarray(lines, np.float32) - expected)) < 1e-6


@pytest.mark.parametrize("fmt", FORMATS)
def test_serving_names_the_id_function_and_refuses_one_it_does_not_implement(exported, fmt, tmp_path):
    root = exported.single if fmt == "single" else exported.store / "v000001"
    meta = json.loads((root / MANIFEST).read_text())
    assert meta["hash_function"] == HASH_FUNCTION  # what maps raw values to the ids it looks up
    other = tmp_path / "other"
    shutil.copytree(root, other)
    # Signed as the exporter would sign it: the hash function check is what refuses it, not the signature.
    write_manifest(other, {**meta, "hash_function": "murmur3_32(value) mod vocab_size"}, signer(AUTO))
    with pytest.raises(ServingModelError, match="'murmur3_32.*which this code does not implement"):
        InferenceModel.load(other)


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_of_a_directory_without_manifest_fails(exported, fmt, tmp_path, capsys):
    partial = tmp_path / "partial"
    shutil.copytree(exported.ckpt, partial)
    (partial / ckpt_io.MANIFEST).unlink()
    out = tmp_path / "serving"
    with pytest.raises(ckpt_io.CheckpointError, match="MANIFEST.json is missing"):
        export_single(partial, out) if fmt == "single" else export_sharded(partial, str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partial"]  # nothing staged either
    assert main(["export", "--checkpoint", str(partial), "--out", str(out), "--format", fmt]) == 2
    assert "MANIFEST.json is missing" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partial"]


def test_export_replaces_an_earlier_export_but_nothing_else(exported, tmp_path):
    out = export_single(exported.ckpt, tmp_path / "serving")
    (out / "stale").write_text("from an earlier export")
    export_single(exported.ckpt, out)
    assert not (out / "stale").exists() and (out / MANIFEST).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["serving"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        export_single(exported.ckpt, other)
    assert (other / "notes.txt").read_text() == "keep me"


def test_load_refuses_an_incomplete_serving_model(exported, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(exported.single, broken)
    (broken / IDS_FILE).unlink()
    with pytest.raises(ServingModelError, match="ids.npy is missing"):
        InferenceModel.load(broken)
    np.save(broken / IDS_FILE, np.load(exported.single / IDS_FILE)[:-1])
    with pytest.raises(ServingModelError, match="ids.npy has sha256"):
        InferenceModel.load(broken)
    with pytest.raises(ServingModelError, match="embedding table has"):
        InferenceModel.load(broken, verify=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ServingModelError, match="empty is not a serving model: it holds no serving.json, and as an "
                                                "export store no published version"):
        InferenceModel.load(tmp_path / "empty")


def test_a_tampered_shard_is_refused_in_one_line(exported, tmp_path):
    copy = tmp_path / "v000001"
    shutil.copytree(exported.store / "v000001", copy)
    meta = json.loads((copy / MANIFEST).read_text())
    rel = meta["shards"][1]["rows"]
    rows = np.load(copy / rel)
    rows[0, 0] += 1
    np.save(copy / rel, rows)
    digest = ckpt_io.file_digest(copy / rel)[1]
    with pytest.raises(ServingModelError) as refused:
        InferenceModel.load(copy)
    message = str(refused.value)
    assert "\n" not in message and str(copy / rel) in message
    assert digest in message and meta["files"][rel]["sha256"] in message
    assert InferenceModel.load(copy, verify=False).table.lookup(exported.checkpoint.ids[:1]).shape == (1, EMBEDDING_DIM)


def test_the_sharded_model_maps_its_shards_instead_of_reading_them(exported):
    model = InferenceModel.load(exported.store)
    layers = [layer for shard in model.table.layers for layer in shard]
    assert len(layers) == SHARD_NUM and all(isinstance(layer.rows, np.memmap) for layer in layers)


@pytest.mark.parametrize("fmt", FORMATS)
def test_predict_checks_its_inputs(exported, fmt, data_dir):
    model = InferenceModel.load(exported.model_path(fmt))
    _, dense, sparse = read_test_split(data_dir)
    with pytest.raises(ValueError, match="sparse slots"):
        model.predict(dense, sparse[:-1])
    with pytest.raises(ValueError, match="dense features"):
        model.predict(dense[:-1], sparse)


def test_a_schema_without_dense_features(tmp_path):
    """No dense slot: the model feeds only the sparse slots (numeric slot names become slot_<n> variables)."""
    schema = Schema(0, ["1", "2", "3"])
    data = tmp_path / "data"
    rng = np.random.default_rng(1)
    for split, rows in (("train", 300), ("test", 100)):
        (data / split).mkdir(parents=True)
        (data / split / "part-00000.txt").write_text("".join(
            format_line(int(rng.integers(0, 2)), [], [rng.integers(0, 60, rng.integers(1, 4)).tolist()
                                                      for _ in schema.sparse_slots], schema) + "\n"
            for _ in range(rows)))
    (data / "stats.json").write_text(json.dumps({"schema": schema.to_dict(), "shards": {
        split: [f"{split}/part-00000.txt"] for split in ("train", "test")}}))
    checkpoint = make_checkpoint(data, "deepfm")
    ckpt = commit_checkpoint(tmp_path / "checkpoint", checkpoint)
    single = export_single(ckpt, tmp_path / "serving")
    meta = export_sharded(ckpt, str(tmp_path / "store"))
    assert json.loads((single / MANIFEST).read_text())["feed_names"] == ["slot_1", "slot_2", "slot_3"]
    assert meta["feed_names"] == ["slot_1.rows", "slot_2.rows", "slot_3.rows"]
    labels, dense, sparse = read_test_split(data)
    assert dense.shape == (100, 0)
    expected = Scorer(checkpoint, calibrated=True).predict(dense, sparse)
    for path in (single, tmp_path / "store"):
        model = InferenceModel.load(path)
        assert np.max(np.abs(model.predict(dense, sparse) - expected)) < 1e-6
        assert np.max(np.abs(model.predict(None, sparse) - expected)) < 1e-6
    assert len(np.unique(expected)) > 10


def test_rows_merged_from_the_workers_export_as_the_servers_files_do(data_dir, tmp_path):
    """Geo and SSD checkpoints carry their rows in export/embedding.npz: both formats read them from there."""
    checkpoint = make_checkpoint(data_dir, "wide_deep")
    from_files = commit_checkpoint(tmp_path / "files", checkpoint)
    from_workers = commit_checkpoint(tmp_path / "workers", checkpoint, rows_from_workers=True)
    assert not (from_workers / ckpt_io.TABLES).exists()
    _, dense, sparse = read_test_split(data_dir)
    expected = InferenceModel.load(export_single(from_files, tmp_path / "single")).predict(dense, sparse)
    export_sharded(from_workers, str(tmp_path / "store"))
    for model in (InferenceModel.load(export_single(from_workers, tmp_path / "single-workers")),
                  InferenceModel.load(tmp_path / "store")):
        assert np.max(np.abs(model.predict(dense, sparse) - expected)) <= 1e-6
