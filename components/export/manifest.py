"""What a serving directory says about itself (``serving.json``), how its files are checked, how one is put in place.

Both formats write ``serving.json`` last, with ``format`` (``single`` or ``sharded``: ``export.format``),
``format_version`` and, under ``files``, every other file with its size and sha256. A loader checks the files
against it (:func:`verify_files`), so a truncated or altered file is refused in one line naming it and both
digests. A directory is staged beside its final place and renamed there (:func:`swap_in`): complete or absent.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from components.checkpoint.format import file_digest
from components.data_prep.hashing import HASH_FUNCTION, check_hash_function
from components.data_prep.transform import ID_COUNTS_FILE, TRANSFORM_DIR, TRANSFORM_FILE, Transform, TransformError
from components.networks.scoring import DOWNSAMPLING_CORRECTION, negative_sample_rate
from components.safe_paths import UnsafePathError, check_rel, inside

MANIFEST = "serving.json"
SIGNATURE = f"{MANIFEST}.sig"  # beside it: components.export.signing
FORMAT_VERSION = 1
FORMATS = ("single", "sharded")  # export.format


class ServingModelError(RuntimeError):
    """A serving model or export version that is incomplete, inconsistent or altered."""


def checkpoint_facts(meta: dict[str, Any], manifest_sha256: str, source: dict[str, Any]) -> dict[str, Any]:
    """What both formats record of the checkpoint they come from (its ``model.json``; ``source``: where it is)."""
    table = meta["table"]
    return {
        "format_version": FORMAT_VERSION,
        "model_name": meta["model"]["name"], "model": meta["model"], "schema": meta["schema"],
        "embedding_dim": int(table["embedding_dim"]),
        "vocab_size": table.get("vocab_size"),
        # Checkpoints made before the name was recorded used the same (and only) function.
        "hash_function": meta.get("hash_function") or HASH_FUNCTION,
        # Applied in the program, in this order: it outputs corrected, then calibrated probabilities.
        "negative_sample_rate": negative_sample_rate(meta), "correction": DOWNSAMPLING_CORRECTION,
        "calibration": meta.get("calibration"),
        # A network that starts from the baseline: its buckets' count (each slot also feeds id % this).
        "baseline_features": meta.get("baseline_features"),
        "source_checkpoint": {"manifest_sha256": manifest_sha256, "mode": meta.get("mode"), "rows": meta.get("rows"),
                              "paddle_version": meta.get("paddle_version"), **source},
    }


def copy_transform(dataset_dir: Optional[str | os.PathLike], staging: Path,
                   meta: dict[str, Any]) -> tuple[list[str], Optional[dict[str, Any]]]:
    """Copy the transform of the dataset the checkpoint trained on (``meta``: its ``model.json``) into
    ``staging/transform/``; returns ``(the files copied, relative to staging; serving.json["transform"])``. No
    dataset, or one without a transform (made before transforms were recorded, or by a synthetic generator not
    shaped like Criteo): ``([], None)``, an export that scores MultiSlot shards only."""
    if dataset_dir is None:
        return [], None
    source = Path(dataset_dir) / TRANSFORM_DIR
    if not (source / TRANSFORM_FILE).is_file():
        print(f"warning: the dataset {dataset_dir} holds no {TRANSFORM_DIR}/{TRANSFORM_FILE}: the export will score "
              "MultiSlot shards only, not raw records", flush=True)
        return [], None
    try:
        transform = Transform.load(source)
    except (TransformError, ValueError) as err:
        raise ServingModelError(f"the dataset {dataset_dir}: {err}") from None
    if transform.schema.to_dict() != meta["schema"]:
        raise ServingModelError(f"the dataset {dataset_dir} has schema {transform.schema.to_dict()}, the checkpoint "
                                f"{meta['schema']}: give the dataset the checkpoint trained on")
    vocab_size = meta["table"].get("vocab_size")
    if vocab_size is not None and int(vocab_size) != transform.vocab_size:
        raise ServingModelError(f"the dataset {dataset_dir} hashes ids into {transform.vocab_size} values, the "
                                f"checkpoint's table into {vocab_size}: give the dataset the checkpoint trained on")
    names = [TRANSFORM_FILE, *([ID_COUNTS_FILE] if transform.min_id_count > 1 else [])]
    (staging / TRANSFORM_DIR).mkdir()
    for name in names:
        shutil.copyfile(source / name, staging / TRANSFORM_DIR / name)
    return [f"{TRANSFORM_DIR}/{name}" for name in names], transform.to_dict()


def load_transform(root: Path, manifest: dict[str, Any]) -> Optional[Transform]:
    """The transform of the version or model at ``root`` (None when it was exported without one), checked to be
    the one ``serving.json`` describes."""
    if manifest.get("transform") is None:
        return None
    try:
        transform = Transform.load(local_file(root, TRANSFORM_DIR))
    except (TransformError, ValueError) as err:
        raise ServingModelError(f"{root}: {err}") from None
    if transform.to_dict() != manifest["transform"] or transform.schema.to_dict() != manifest["schema"]:
        raise ServingModelError(f"{root}: {TRANSFORM_DIR}/{TRANSFORM_FILE} is not the transform {MANIFEST} "
                                "describes: altered, refusing it")
    return transform


def store_rel(rel: str, where: str) -> str:
    """``rel``, a file name a manifest gave, checked to stay inside its version (:func:`check_rel`) as a
    :class:`ServingModelError`: a store's writer controls ``serving.json``, a reader must not follow it out."""
    try:
        return check_rel(rel, f"{MANIFEST} of {where}")
    except UnsafePathError as err:
        raise ServingModelError(str(err)) from None


def local_file(root: Path, rel: str) -> Path:
    """``root/rel`` on this machine, refused unless it stays inside ``root``, symlinks followed (:func:`inside`)."""
    try:
        return inside(root, rel, f"{MANIFEST} of {root}")
    except UnsafePathError as err:
        raise ServingModelError(str(err)) from None


def file_entries(root: Path, rels: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{rel: {"size", "sha256"}}`` of files under ``root``: what ``serving.json["files"]`` records."""
    entries = {}
    for rel in sorted(rels):
        size, sha = file_digest(root / rel)
        entries[rel] = {"size": size, "sha256": sha}
    return entries


def write_manifest(root: Path, manifest: dict[str, Any], sign: Optional[Callable[[bytes], bytes]] = None) -> None:
    """``root/serving.json`` and, with ``sign`` (:class:`components.export.signing.Signer`), its signature of
    those exact bytes, written first: a reader that sees ``serving.json`` sees its signature too."""
    data = json.dumps(manifest, indent=2, sort_keys=True).encode()
    if sign is not None:
        (root / SIGNATURE).write_bytes(sign(data))
    (root / MANIFEST).write_bytes(data)


def read_manifest(root: str | os.PathLike) -> dict[str, Any]:
    """``root/serving.json`` as :func:`parse_manifest` checks it, its signature unchecked (the exporter's and
    the loader's own reads; a loader of a store goes through :class:`components.export.signing.Verifier`)."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise ServingModelError(f"{root} is not a serving model: {MANIFEST} is missing")
    return parse_manifest(path, path.read_bytes())


def parse_manifest(path: Path, data: bytes) -> dict[str, Any]:
    """``data`` (the bytes of ``path``), checked to be a format and version this code reads, with a hash
    function it implements."""
    try:
        manifest = json.loads(data)
    except ValueError as err:
        raise ServingModelError(f"{path} is not valid JSON ({err}): truncated or altered") from None
    if not isinstance(manifest, dict):
        raise ServingModelError(f"{path} holds no JSON object: truncated or altered")
    if manifest.get("format") not in FORMATS or manifest.get("format_version") != FORMAT_VERSION:
        raise ServingModelError(f"{path}: format {manifest.get('format')!r} version "
                                f"{manifest.get('format_version')!r}; this code reads {' and '.join(FORMATS)} "
                                f"version {FORMAT_VERSION}")
    try:
        check_hash_function(manifest.get("hash_function"), str(path))
    except ValueError as err:
        raise ServingModelError(str(err)) from None
    return manifest


def verify_file(path: Path, expected: dict[str, Any]) -> None:
    """Refuse a file whose size or sha256 is not what its manifest recorded."""
    if not path.is_file():
        raise ServingModelError(f"{path} is missing: {MANIFEST} lists it")
    size, sha = file_digest(path)
    if sha != expected["sha256"] or size != expected["size"]:
        raise ServingModelError(f"{path} has sha256 {sha} ({size} bytes), {MANIFEST} says {expected['sha256']} "
                                f"({expected['size']} bytes): truncated or altered, refusing it")


def verify_files(root: Path, manifest: dict[str, Any]) -> None:
    """Check every file ``manifest`` lists under ``root`` (:func:`verify_file`)."""
    for rel, expected in sorted(manifest["files"].items()):
        verify_file(local_file(root, rel), expected)


def check_replaceable(out: Path) -> None:
    """``out`` may be absent, an empty directory or an earlier serving model; anything else is refused."""
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / MANIFEST).is_file())):
        raise FileExistsError(f"{out} exists and is not a serving model: refusing to replace it")


def swap_in(staging: Path, out: Path) -> None:
    """Rename ``staging`` to ``out``; an existing ``out`` is moved aside first and removed after."""
    os.chmod(staging, 0o755)  # mkdtemp makes it private
    if not out.exists():
        os.rename(staging, out)
        return
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(out, old)
    try:
        os.rename(staging, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
