"""The servable inference model (components.serving) and the pipeline's export step, on real checkpoints
built directly (random but fixed parameters; no PS job)."""

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
from components.config import ExportDtype, from_dict, to_dict
from components.data_prep.hashing import HASH_FUNCTION
from components.data_prep.multislot import RaggedIds, Schema, format_line, read_shards
from components.data_prep.prepare import prepare_synthetic
from components.evaluate.evaluate import evaluate
from components.ps.scoring import Scorer, build_program, read_test_split, row_indices
from components.evaluate.metrics import binary_metrics
from components.serving import (IDS_FILE, SERVING_META, InferenceModel, ServingModelError, export_inference_model,
                                main)
from components.ps.models import EMBEDDING_TABLE
from tests.conftest import calibrated_reference, commit_staged_checkpoint, score_serving_model

FAMILIES = ("dnn", "wide_deep", "deepfm", "dcn")
# The calibration a checkpoint carries (fitted on the validation split while it trained): serving applies it.
CALIBRATION = {"method": "platt", "a": 1.3, "b": -0.2}
EMBEDDING_DIM = 5
VOCAB = 5000
# float16 keeps 11 significant bits: rounding moves a weight by at most 2**-11 of its value.
FLOAT16_MAX_RELATIVE_ERROR = 2.0 ** -11


def build_checkpoint(root: Path, data_dir: Path, model: str, seed: int = 0) -> Path:
    """A committed checkpoint as the train step leaves it: rows for the train split's ids (every 5th id left
    out, so the test split holds unseen ids) and every dense parameter of the model."""
    stats = json.loads((data_dir / "stats.json").read_text())
    schema = Schema.from_dict(stats["schema"])
    cfg = from_dict({"model": {"name": model, "hidden": [16, 8]},
                     "table": {"embedding_dim": EMBEDDING_DIM, "vocab_size": VOCAB}})
    _, _, sparse = read_shards([data_dir / p for p in stats["shards"]["train"]], schema)
    ids = np.delete(np.unique(np.concatenate([slot.values for slot in sparse])).astype(np.uint64), np.s_[::5])
    rng = np.random.default_rng(seed)
    rows = rng.normal(0, 0.3, (len(ids), EMBEDDING_DIM)).astype(np.float32)
    program = build_program(cfg.model, schema, len(ids) + 1, EMBEDDING_DIM)
    dense = {p.name: rng.normal(0, 0.3, p.shape).astype(np.float32)
             for p in program.main.all_parameters() if p.name != EMBEDDING_TABLE}
    ckpt_io.save_export(root, ids, rows, dense)
    full = to_dict(cfg)
    return commit_staged_checkpoint(root, {"model": full["model"], "table": full["table"], "mode": "async",
                                           "schema": stats["schema"], "servers": 1, "workers": 1,
                                           "paddle_version": paddle.__version__, "training": {}, "rows": int(len(ids)),
                                           "calibration": CALIBRATION})


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serving") / "data"
    prepare_synthetic(out, rows=2000, test_fraction=0.25, num_shards=2, vocab_size=VOCAB, seed=3)
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, data_dir, tmp_path_factory):
    """``(checkpoint dir, serving model dir)`` of one model family."""
    root = tmp_path_factory.mktemp(request.param)
    ckpt = build_checkpoint(root / "checkpoint", data_dir, request.param, seed=FAMILIES.index(request.param))
    return ckpt, export_inference_model(ckpt, root / "serving")


def test_export_writes_the_paddle_inference_format(exported):
    ckpt, serving = exported
    assert sorted(p.name for p in serving.iterdir()) == ["ids.npy", "model.pdiparams", "model.pdmodel",
                                                         "serving.json"]
    assert not [p for p in serving.parent.iterdir() if p.name.startswith(".")]  # no staging left behind
    meta = json.loads((serving / SERVING_META).read_text())
    checkpoint = ckpt_io.load(ckpt)
    assert meta["model_name"] == checkpoint.meta["model"]["name"] and meta["schema"] == checkpoint.meta["schema"]
    assert meta["feed_names"] == ["dense", *checkpoint.meta["schema"]["sparse_slots"]]
    assert [feed["name"] for feed in meta["feeds"]] == meta["feed_names"]
    assert meta["paddle_version"] == paddle.__version__
    assert meta["source_checkpoint"]["path"] == str(ckpt.resolve())
    assert meta["table_rows"] == len(checkpoint.ids) + 1 and meta["unseen_row"] == len(checkpoint.ids)
    assert np.array_equal(np.load(serving / IDS_FILE), checkpoint.ids)


def test_exported_model_predicts_like_the_scorer_and_evaluation(exported, data_dir, tmp_path):
    ckpt, serving = exported
    labels, dense, sparse = read_test_split(data_dir)
    raw = Scorer(ckpt_io.load(ckpt)).predict(dense, sparse)
    expected = calibrated_reference(raw, CALIBRATION)  # what the served program computes, in float32
    got = InferenceModel.load(serving).predict(dense, sparse)
    assert got.shape == expected.shape == labels.shape
    assert np.max(np.abs(got - expected)) < 1e-6 and np.max(np.abs(got - raw)) > 1e-3
    scored = score_serving_model(serving, data_dir)
    assert np.max(np.abs(scored["preds"] - expected)) < 1e-6
    metrics = evaluate(ckpt, data_dir, tmp_path / "eval", from_dict({"eval": {"baseline": False}}).eval)
    for key in ("auc", "calibration", "logloss"):  # the evaluation scores with the served program's arithmetic
        assert scored["metrics"][key] == pytest.approx(metrics[key], abs=1e-12), key
    assert metrics["uncalibrated_logloss"] == pytest.approx(binary_metrics(labels, raw)["logloss"], abs=1e-9)
    assert len(np.unique(got)) > len(got) // 2  # the model is not a constant


def test_a_paddle_inference_predictor_serves_it(exported, data_dir):
    _, serving = exported
    _, dense, sparse = read_test_split(data_dir)
    n = 300
    got = _paddle_inference_predict(serving, dense, sparse, n)
    expected = InferenceModel.load(serving).predict(dense[:n], [_head(slot, n) for slot in sparse])
    assert np.max(np.abs(got - expected)) < 1e-6


def _paddle_inference_predict(serving: Path, dense: np.ndarray, sparse: list[RaggedIds], n: int) -> np.ndarray:
    """Another runtime, fed as serving.json says: row indices (ids.npy) with one LoD sequence per example."""
    meta = json.loads((serving / SERVING_META).read_text())
    config = paddle.inference.Config(str(serving / meta["model_file"]), str(serving / meta["params_file"]))
    config.disable_gpu()
    config.disable_glog_info()
    predictor = paddle.inference.create_predictor(config)
    assert predictor.get_input_names() == meta["feed_names"]
    ids = np.load(serving / IDS_FILE)
    handle = predictor.get_input_handle("dense")
    handle.reshape([n, dense.shape[1]])
    handle.copy_from_cpu(np.ascontiguousarray(dense[:n]))
    for name, slot in zip(meta["feed_names"][1:], sparse):
        rows = row_indices(ids, slot.values[:slot.offsets[n]]).reshape(-1, 1)
        handle = predictor.get_input_handle(name)
        handle.reshape(list(rows.shape))
        handle.copy_from_cpu(rows)
        handle.set_lod([slot.offsets[:n + 1].tolist()])
    predictor.run()
    return predictor.get_output_handle(meta["fetch_names"][0]).copy_to_cpu().ravel()


def _head(slot: RaggedIds, n: int) -> RaggedIds:
    return RaggedIds(slot.values[:slot.offsets[n]], slot.offsets[:n + 1])


def _one_example(slots: list[list[int]], dense_dim: int) -> tuple[np.ndarray, list[RaggedIds]]:
    dense = np.full((1, dense_dim), 0.5, np.float32)
    return dense, [RaggedIds(np.asarray(ids, np.int64), np.asarray([0, len(ids)], np.int64)) for ids in slots]


def test_unseen_ids_score_with_the_zero_row(exported):
    ckpt, serving = exported
    model = InferenceModel.load(serving)
    scorer = Scorer(ckpt_io.load(ckpt), calibrated=True)  # as served
    seen = [int(i) for i in model.ids[: len(model.schema.sparse_slots)]]
    unseen = [VOCAB + 7, VOCAB + 11]  # outside the hashed id range: never trained
    assert not np.isin(np.asarray(unseen, np.uint64), model.ids).any()
    assert list(row_indices(model.ids, np.asarray(unseen))) == [len(model.ids)] * 2
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
    _, serving = exported
    _, _, sparse = read_test_split(data_dir)
    values = np.concatenate([slot.values for slot in sparse]).astype(np.uint64)
    unseen = ~np.isin(values, np.load(serving / IDS_FILE))
    assert 0 < unseen.sum() < len(values)


def _float16_twin(ckpt: Path, out: Path) -> Path:
    """The same checkpoint, its export's rows stored as ``checkpoint.export_dtype=float16`` stores them."""
    checkpoint = ckpt_io.load(ckpt)
    ckpt_io.save_export(out, checkpoint.ids, checkpoint.rows, checkpoint.dense, ExportDtype.float16)
    return commit_staged_checkpoint(out, checkpoint.meta)


def _file_size(root: Path, rel: str) -> int:
    return (root / rel).stat().st_size


def test_float16_export_halves_the_rows_and_loads_back_rounded(exported, tmp_path):
    ckpt, _ = exported
    full = ckpt_io.load(ckpt)
    half = ckpt_io.load(_float16_twin(ckpt, tmp_path / "float16"))
    assert half.rows.dtype == np.float16 and np.array_equal(half.rows, full.rows.astype(np.float16))
    assert np.array_equal(half.ids, full.ids)
    # Dense parameters stay float32: resume restores them from this export.
    assert half.dense.keys() == full.dense.keys()
    for name, value in full.dense.items():
        assert half.dense[name].dtype == np.float32 and np.array_equal(half.dense[name], value)
    # The file loses exactly half the rows' bytes; the uint64 ids and the npz framing stay as they were.
    embedding = f"{ckpt_io.EXPORT}/{ckpt_io.EMBEDDING_FILE}"
    assert _file_size(ckpt, embedding) - _file_size(tmp_path / "float16", embedding) == full.rows.nbytes // 2


def test_float16_serving_model_predicts_like_the_float32_one(exported, data_dir, tmp_path):
    ckpt, serving = exported
    half_ckpt = _float16_twin(ckpt, tmp_path / "float16")
    half_serving = export_inference_model(half_ckpt, tmp_path / "serving16")
    assert json.loads((serving / SERVING_META).read_text())["embedding_dtype"] == "float32"
    assert json.loads((half_serving / SERVING_META).read_text())["embedding_dtype"] == "float16"
    # The table (checkpoint rows + the zero row) is stored float16: the params file loses half its bytes.
    full = ckpt_io.load(ckpt)
    table_bytes = (len(full.ids) + 1) * EMBEDDING_DIM * 4
    params = "model.pdiparams"
    assert _file_size(serving, params) - _file_size(half_serving, params) == table_bytes // 2

    labels, dense, sparse = read_test_split(data_dir)
    expected = InferenceModel.load(serving).predict(dense, sparse)
    got = InferenceModel.load(half_serving).predict(dense, sparse)
    # It is the float16 checkpoint's scorer, and another runtime serves it the same.
    assert np.max(np.abs(got - Scorer(ckpt_io.load(half_ckpt), calibrated=True).predict(dense, sparse))) < 1e-6
    n = 300
    assert np.max(np.abs(_paddle_inference_predict(half_serving, dense, sparse, n) - got[:n])) < 1e-6
    # Tolerance: rounding to float16 moves each weight by at most 2**-11 of its value, so the yardstick is a
    # float32 twin whose every row weight is moved by exactly that much (random signs). Most weights round
    # by less: float16 stayed at 0.3-0.6 of the twin's largest deviation (3 seeds x 3 model families).
    signs = np.random.default_rng(0).choice([-1.0, 1.0], full.rows.shape)
    nudged = dataclasses.replace(full, rows=(full.rows * (1 + FLOAT16_MAX_RELATIVE_ERROR * signs)).astype(np.float32))
    yardstick = np.max(np.abs(Scorer(nudged, calibrated=True).predict(dense, sparse) - expected))
    assert 0 < np.max(np.abs(got - expected)) <= yardstick
    assert binary_metrics(labels, got)["auc"] == pytest.approx(binary_metrics(labels, expected)["auc"], abs=0.002)


def test_float16_export_refuses_values_it_cannot_hold(tmp_path):
    ids = np.arange(3, dtype=np.uint64)
    rows = np.array([[0.5, 1.0], [7e4, 0.0], [-1.0, 2.0]], np.float32)  # float16 ends at 65504
    with pytest.raises(ckpt_io.CheckpointError, match="up to 70000 do not fit checkpoint.export_dtype=float16"):
        ckpt_io.save_export(tmp_path / "half", ids, rows, {}, ExportDtype.float16)
    assert not (tmp_path / "half").exists()
    ckpt_io.save_export(tmp_path / "full", ids, rows, {}, ExportDtype.float32)
    with np.load(tmp_path / "full" / ckpt_io.EXPORT / ckpt_io.EMBEDDING_FILE) as table:
        assert np.array_equal(table["rows"], rows)


def test_cli_predict_writes_one_probability_per_example(exported, data_dir, tmp_path, capsys):
    _, serving = exported
    stats = json.loads((data_dir / "stats.json").read_text())
    shards = [data_dir / p for p in stats["shards"]["test"]]
    out = tmp_path / "out" / "preds.txt"
    assert main(["predict", "--model", str(serving), "--input", str(data_dir / "test" / "part-*.txt"),
                 "--output", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == stats["rows"]["test"]
    assert f"{len(lines)} predictions from {len(shards)} file(s)" in capsys.readouterr().out
    _, dense, sparse = read_shards(sorted(shards), Schema.from_dict(stats["schema"]))
    expected = InferenceModel.load(serving).predict(dense, sparse)
    assert np.array_equal(np.asarray(lines, np.float32), expected)  # %.9g: float32 reads back exactly
    # Files in the order given, each glob's matches sorted.
    reverse = tmp_path / "reverse.txt"
    assert main(["predict", "--model", str(serving), "--input", *map(str, sorted(shards)[::-1]),
                 "--output", str(reverse)]) == 0
    first = sum(1 for _ in open(sorted(shards)[-1]))
    # (a row's float32 result may move in the last bits with its position in the batch)
    assert np.allclose(np.asarray(reverse.read_text().splitlines()[:first], np.float32),
                       np.asarray(lines[-first:], np.float32), rtol=0, atol=1e-6)


def test_cli_end_to_end_in_a_fresh_process(data_dir, tmp_path):
    """``python -m components.serving export`` then ``predict`` on new MultiSlot lines, with unseen ids."""
    ckpt = build_checkpoint(tmp_path / "checkpoint", data_dir, "deepfm")
    schema = Schema.from_dict(json.loads((data_dir / "stats.json").read_text())["schema"])
    new = tmp_path / "new.txt"
    rng = np.random.default_rng(5)
    new.write_text("".join(
        format_line(0, rng.normal(size=schema.dense_dim).tolist(),
                    [rng.integers(0, 2 * VOCAB, rng.integers(1, 3)).tolist() for _ in schema.sparse_slots], schema)
        + "\n" for _ in range(37)))
    serving, preds = tmp_path / "serving", tmp_path / "preds.txt"
    for args in (["export", "--checkpoint", str(ckpt), "--out", str(serving)],
                 ["predict", "--model", str(serving), "--input", str(new), "--output", str(preds)]):
        proc = subprocess.run([sys.executable, "-m", "components.serving", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    lines = preds.read_text().splitlines()
    assert len(lines) == 37
    _, dense, sparse = read_shards([new], schema)
    expected = Scorer(ckpt_io.load(ckpt), calibrated=True).predict(dense, sparse)
    assert np.max(np.abs(np.asarray(lines, np.float32) - expected)) < 1e-6


def test_serving_names_the_id_function_and_refuses_one_it_does_not_implement(exported, tmp_path):
    _, serving = exported
    meta = json.loads((serving / SERVING_META).read_text())
    assert meta["hash_function"] == HASH_FUNCTION  # what maps raw values to the ids it looks up
    other = tmp_path / "other"
    shutil.copytree(serving, other)
    (other / SERVING_META).write_text(json.dumps({**meta, "hash_function": "murmur3_32(value) mod vocab_size"}))
    with pytest.raises(ServingModelError, match="'murmur3_32.*which this code does not implement"):
        InferenceModel.load(other)


def test_export_of_a_directory_without_manifest_fails(exported, tmp_path, capsys):
    ckpt, _ = exported
    partial = tmp_path / "partial"
    shutil.copytree(ckpt, partial)
    (partial / ckpt_io.MANIFEST).unlink()
    with pytest.raises(ckpt_io.CheckpointError, match="MANIFEST.json is missing"):
        export_inference_model(partial, tmp_path / "serving")
    assert not (tmp_path / "serving").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partial"]  # nothing staged either
    assert main(["export", "--checkpoint", str(partial), "--out", str(tmp_path / "serving")]) == 2
    assert "MANIFEST.json is missing" in capsys.readouterr().err


def test_export_replaces_an_earlier_export_but_nothing_else(exported, tmp_path):
    ckpt, _ = exported
    out = export_inference_model(ckpt, tmp_path / "serving")
    (out / "stale").write_text("from an earlier export")
    export_inference_model(ckpt, out)
    assert not (out / "stale").exists() and (out / SERVING_META).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["serving"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        export_inference_model(ckpt, other)
    assert (other / "notes.txt").read_text() == "keep me"


def test_load_refuses_an_incomplete_serving_model(exported, tmp_path):
    _, serving = exported
    broken = tmp_path / "broken"
    shutil.copytree(serving, broken)
    (broken / IDS_FILE).unlink()
    with pytest.raises(ServingModelError, match="ids.npy is missing"):
        InferenceModel.load(broken)
    np.save(broken / IDS_FILE, np.load(serving / IDS_FILE)[:-1])
    with pytest.raises(ServingModelError, match="embedding table has"):
        InferenceModel.load(broken)


def test_predict_checks_its_inputs(exported, data_dir):
    _, serving = exported
    model = InferenceModel.load(serving)
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
    ckpt = build_checkpoint(tmp_path / "checkpoint", data, "deepfm")
    serving = export_inference_model(ckpt, tmp_path / "serving")
    assert json.loads((serving / SERVING_META).read_text())["feed_names"] == ["slot_1", "slot_2", "slot_3"]
    labels, dense, sparse = read_test_split(data)
    assert dense.shape == (100, 0)
    expected = Scorer(ckpt_io.load(ckpt), calibrated=True).predict(dense, sparse)
    model = InferenceModel.load(serving)
    assert np.max(np.abs(model.predict(dense, sparse) - expected)) < 1e-6
    assert np.max(np.abs(model.predict(None, sparse) - expected)) < 1e-6
    assert len(np.unique(expected)) > 10
