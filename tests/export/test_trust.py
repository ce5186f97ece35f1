"""Trust nothing from a store: file names a ``serving.json`` gives stay inside their version (memory:// and local
stores, on download and on load), and an export is loaded only when its ``serving.json`` is signed with the
operator's key."""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pytest

from components.data_prep.prepare import prepare_synthetic
from components.export.manifest import MANIFEST, SIGNATURE, ServingModelError, write_manifest
from components.export.model import InferenceModel
from components.export.serving import main
from components.export.sharded import export_sharded
from components.export.signing import (AUTO, FIX, NONE, PRIVATE_KEY, PUBLIC_KEY, PUBLIC_KEY_ENV, Signer,
                                       ensure_user_key, public_pem, signer, user_key_dir)
from components.export.single import export_single
from components.export.store import ExportStore
from components.networks.scoring import read_test_split
from tests.export.checkpoints import VOCAB, commit_checkpoint, make_checkpoint
from tests.export.keys import new_key_pair

TRAVERSALS = ("../../escaped.npy", "/tmp/absolute-escape.npy")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trust") / "data"
    prepare_synthetic(out, rows=600, test_fraction=0.25, num_shards=1, vocab_size=VOCAB, seed=7)
    return out


@pytest.fixture(scope="module")
def ckpt(data_dir, tmp_path_factory) -> Path:
    return commit_checkpoint(tmp_path_factory.mktemp("trust-ckpt") / "checkpoint",
                             make_checkpoint(data_dir, "dnn", seed=3))


@pytest.fixture(scope="module")
def store(ckpt, tmp_path_factory) -> Path:
    """A local export store holding a signed base (version 1) and a signed delta on it (version 2)."""
    uri = tmp_path_factory.mktemp("trust-exports") / "store"
    for _ in range(2):
        export_sharded(ckpt, str(uri))
    return uri


def _crafted(source: Path, out: Path, edit, sign: bool = True) -> Path:
    """A copy of the version ``source`` whose ``serving.json`` ``edit`` changed, signed with the per-user key
    (as an attacker holding the key, or a bug in the exporter, would write it): the path checks alone refuse it."""
    shutil.copytree(source, out)
    manifest = json.loads((out / MANIFEST).read_text())
    edit(manifest)
    (out / SIGNATURE).unlink()
    write_manifest(out, manifest, signer(AUTO) if sign else None)
    return out


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


# ---- paths -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ("dotdot", "absolute"))
def test_a_memory_store_naming_a_file_outside_the_version_writes_nothing_outside_the_download(store, tmp_path,
                                                                                             kind):
    escaped = tmp_path / "escaped.npy"
    cache = tmp_path / "deep" / "cache"  # versions land in cache/v000001: ../../ leads to tmp_path
    name = "../../../escaped.npy" if kind == "dotdot" else str(escaped)
    fs = fsspec.filesystem("memory")
    root = f"/trust-{uuid.uuid4().hex[:8]}/store"
    fs.put(str(store / "v000001"), f"{root}/v000001", recursive=True)
    manifest = json.loads(fs.cat_file(f"{root}/v000001/{MANIFEST}"))
    manifest["files"][name] = {"size": 3, "sha256": "0" * 64}
    fs.pipe_file(f"{root}/v000001/{MANIFEST}", json.dumps(manifest).encode())
    fs.pipe_file(f"{root}/v000001/{name}", b"bad")  # the memory filesystem keeps the name as it is: fetchable
    with pytest.raises(ServingModelError) as refused:
        InferenceModel.load(f"memory://{root}", cache_dir=cache)
    assert f"bad file name {name!r}" in _one_line(refused)
    with pytest.raises(ServingModelError, match="bad file name"):
        ExportStore(f"memory://{root}").download(1, tmp_path / "copy" / "v000001")
    assert not escaped.exists()


@pytest.mark.parametrize("name", TRAVERSALS)
def test_a_local_version_naming_a_file_outside_it_is_refused_before_it_is_read(store, tmp_path, name):
    outside = tmp_path / "secret.npy"
    np.save(outside, np.arange(3))

    def edit(manifest):
        manifest["files"][name] = manifest["files"].pop("model.pdiparams")

    crafted = _crafted(store / "v000001", tmp_path / "versions" / "v000001", edit)
    with pytest.raises(ServingModelError) as refused:
        InferenceModel.load(crafted)
    assert f"bad file name {name!r}" in _one_line(refused)


def test_a_shard_file_name_outside_the_version_is_refused_even_unverified(store, tmp_path):
    def edit(manifest):
        manifest["shards"][0]["ids"] = "../../../escaped.ids.npy"

    crafted = _crafted(store / "v000001", tmp_path / "v000001", edit)
    with pytest.raises(ServingModelError) as refused:
        InferenceModel.load(crafted, verify=False)
    assert "bad file name '../../../escaped.ids.npy'" in _one_line(refused)


def test_a_symlink_out_of_a_version_is_refused(store, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(store / "v000001" / "model.pdiparams", outside / "model.pdiparams")

    def edit(manifest):
        manifest["files"]["link/model.pdiparams"] = manifest["files"].pop("model.pdiparams")

    crafted = _crafted(store / "v000001", tmp_path / "v000001", edit)
    (crafted / "link").symlink_to(outside)
    with pytest.raises(ServingModelError) as refused:
        InferenceModel.load(crafted)
    message = _one_line(refused)
    assert "'link/model.pdiparams'" in message and "outside" in message


def test_an_unsigned_delta_copied_out_of_its_store_does_not_lead_the_loader_elsewhere(store, tmp_path):
    copy = tmp_path / "serving_model"
    shutil.copytree(store / "v000002", copy)
    (copy / SIGNATURE).unlink()
    with pytest.raises(ServingModelError) as refused:
        InferenceModel.load(copy, allow_unsigned=True)
    assert f"names the export store {store}" in _one_line(refused)
    # In the store it sits in, the same unsigned delta is accepted when asked by name.
    unsigned = _crafted(store / "v000001", tmp_path / "store" / "v000001", lambda m: None, sign=False)
    shutil.copytree(copy, unsigned.parent / "v000002")
    manifest = json.loads((copy / MANIFEST).read_text())
    write_manifest(unsigned.parent / "v000002", {**manifest, "store": str(unsigned.parent)})
    assert InferenceModel.load(unsigned.parent / "v000002", allow_unsigned=True).version == 2


# ---- signatures --------------------------------------------------------------------------------------------


def test_the_per_user_key_is_made_private_in_the_config_dir_on_first_use():
    key = ensure_user_key()
    assert key == user_key_dir() / PRIVATE_KEY and str(user_key_dir()).startswith(os.environ["XDG_CONFIG_HOME"])
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (user_key_dir() / PUBLIC_KEY).read_bytes() == public_pem(Signer(key).key)
    assert ensure_user_key() == key and (user_key_dir() / PUBLIC_KEY).read_bytes() == public_pem(Signer(key).key)


def test_every_version_is_signed_and_loads(store, data_dir):
    for version in ("v000001", "v000002"):
        assert (store / version / SIGNATURE).is_file()
    _, dense, sparse = read_test_split(data_dir)
    model = InferenceModel.load(store)
    assert model.version == 2 and len(model.predict(dense, sparse)) == len(dense)


def test_a_remote_store_receives_the_signature_before_serving_json(ckpt, monkeypatch):
    uri = f"memory://trust-order-{uuid.uuid4().hex[:8]}/store"
    fs = fsspec.filesystem("memory")
    uploaded = []
    put_file = type(fs).put_file

    def recording(self, lpath, rpath, *args, **kwargs):
        uploaded.append(rpath.rsplit("/", 1)[-1])
        return put_file(self, lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(type(fs), "put_file", recording)
    export_sharded(ckpt, uri)
    assert uploaded[-1] == MANIFEST and SIGNATURE in uploaded[:-1]  # serving.json makes the version visible
    assert InferenceModel.load(uri).version == 1


def test_the_copy_of_a_version_carries_its_signature(store, tmp_path):
    out = ExportStore(str(store)).copy_to(2, tmp_path / "serving_model")
    assert (out / SIGNATURE).read_bytes() == (store / "v000002" / SIGNATURE).read_bytes()
    assert InferenceModel.load(out).version == 2


@pytest.mark.parametrize("fmt", ("single", "sharded"))
def test_an_unsigned_export_is_refused_unless_accepted_by_name(ckpt, tmp_path, fmt):
    out = tmp_path / "unsigned"
    if fmt == "single":
        export_single(ckpt, out, signing_key=NONE)
    else:
        export_sharded(ckpt, str(out), signing_key=NONE)
        out = out / "v000001"
    assert not (out / SIGNATURE).exists()
    with pytest.raises(ServingModelError) as refused:
        InferenceModel.load(out)
    assert _one_line(refused) == f"{out} is unsigned (no {SIGNATURE}): {FIX}"
    assert InferenceModel.load(out, allow_unsigned=True).meta["format"] == fmt


def test_a_tampered_serving_json_is_refused(store, tmp_path):
    copy = tmp_path / "v000001"
    shutil.copytree(store / "v000001", copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    (copy / MANIFEST).write_text(json.dumps({**manifest, "calibration": None}, indent=2, sort_keys=True))
    with pytest.raises(ServingModelError) as refused:
        InferenceModel.load(copy)
    message = _one_line(refused)
    assert message.startswith(f"{copy}: {SIGNATURE} does not match {MANIFEST}") and message.endswith(FIX)


def test_a_tampered_delta_in_the_chain_refuses_the_store_and_leaves_a_loaded_model_as_it_was(store, tmp_path):
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    model = InferenceModel.load(copy / "v000001")
    manifest = json.loads((copy / "v000002" / MANIFEST).read_text())
    (copy / "v000002" / MANIFEST).write_text(json.dumps({**manifest, "rows": 1}))
    with pytest.raises(ServingModelError, match=f"{copy / 'v000002'}: {SIGNATURE} does not match"):
        model.apply_delta(copy / "v000002")
    assert model.version == 1
    with pytest.raises(ServingModelError, match="does not match"):
        InferenceModel.load(copy)


def test_the_public_key_comes_from_the_argument_then_the_environment(store, tmp_path, monkeypatch):
    _, other = new_key_pair(tmp_path / "other")
    with pytest.raises(ServingModelError, match=f"with the public key {other}"):
        InferenceModel.load(store, public_key=other)
    monkeypatch.setenv(PUBLIC_KEY_ENV, str(other))
    with pytest.raises(ServingModelError, match="signed with another key"):
        InferenceModel.load(store)
    assert InferenceModel.load(store, public_key=user_key_dir() / PUBLIC_KEY).version == 2  # the argument first


def test_an_export_signed_with_a_key_file_loads_with_its_public_key(ckpt, tmp_path):
    key, public = new_key_pair(tmp_path / "keys")
    model_dir = export_single(ckpt, tmp_path / "model", signing_key=str(key))
    assert InferenceModel.load(model_dir, public_key=public).meta["format"] == "single"
    with pytest.raises(ServingModelError, match="signed with another key"):
        InferenceModel.load(model_dir)  # the per-user key did not sign it


def test_a_key_that_cannot_sign_fails_before_anything_is_written(ckpt, tmp_path):
    (tmp_path / "bad.pem").write_text("not a key")
    with pytest.raises(ValueError, match="export signing key .*bad.pem: .*PEM PKCS#8 EC P-256"):
        export_sharded(ckpt, str(tmp_path / "store"), signing_key=str(tmp_path / "bad.pem"))
    assert not (tmp_path / "store").exists()


def test_predict_command_checks_the_signature_and_accepts_unsigned_by_name(ckpt, data_dir, tmp_path, capsys):
    out = tmp_path / "unsigned"
    export_sharded(ckpt, str(out), signing_key=NONE)
    test_files = [str(data_dir / p) for p in json.loads((data_dir / "stats.json").read_text())["shards"]["test"]]
    args = ["predict", "--model", str(out), "--input", *test_files, "--output", str(tmp_path / "preds.txt")]
    assert main(args) == 2
    assert "--allow-unsigned" in capsys.readouterr().err
    assert main([*args, "--allow-unsigned"]) == 0
    signed = tmp_path / "signed"
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(signed)]) == 0
    args[2] = str(signed)
    assert main([*args, "--public-key", str(tmp_path / "missing.pub")]) == 2
    assert "missing.pub" in capsys.readouterr().err
    assert main([*args, "--public-key", str(user_key_dir() / PUBLIC_KEY)]) == 0
