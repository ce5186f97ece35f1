"""The export store: the serving export's versions under one fsspec URL, each complete or invisible.

Layout under the store URI (a local path, ``s3://bucket/prefix``, any fsspec URL)::

    <uri>/v000001/serving.json   a base (every row), then after it
    <uri>/v000002/serving.json   deltas on the version before, up to ``export.base_every`` of them, then a base...

A version is a directory named by its number (:data:`VERSION_NAME`; :mod:`components.export.sharded` writes
it). It is staged and published by :meth:`ExportStore.publishing`: on a local filesystem the staging directory
is renamed into place, elsewhere its files are uploaded with ``serving.json`` last (after its signature,
:mod:`components.export.signing`). A version without
``serving.json`` (an upload that died) is invisible: never listed, and replaced by the next export of that
number. Every operation goes through the project's storage layer (:mod:`components.storage`: retries on transient
errors, one line for what no wait fixes, scrubbed messages), as the checkpoint store's do.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

from components.config import CtrConfig
from components.export.manifest import (MANIFEST, SIGNATURE, ServingModelError, check_replaceable, local_file,
                                        store_rel, swap_in)
from components.redaction import redact
from components.storage import Storage, StorageError, StorageRefused

VERSION_NAME = "v{:06d}"
_VERSION = re.compile(r"^v(\d{6,})$")


def export_store_uri(cfg: CtrConfig) -> str:
    """``export.uri``, else ``<checkpoint.uri>-serving``: runs that continue one checkpoint store continue one
    chain of exports."""
    return cfg.export.uri or f"{cfg.checkpoint.uri.rstrip('/')}-serving"


class ExportStoreError(ServingModelError, StorageError):
    """The export store could not be read or written (after its retries, where waiting could help)."""


class ExportStoreRefused(ExportStoreError, StorageRefused):
    """The export store refused for good (a full disk, no permission, no credentials)."""


class ExportStore(Storage):
    """The versions under ``uri``. Single writer; any number of readers."""

    Error = ExportStoreError
    Refused = ExportStoreRefused
    Invalid = ServingModelError
    what = "export store"
    within = "an export version"

    def __init__(self, uri: str, storage_options: Optional[dict] = None):
        super().__init__(uri, storage_options=storage_options)
        self.root = self.root.rstrip("/")

    def version_path(self, version: Optional[int] = None, rel: str = "") -> str:
        """A path in the store for ``self.fs`` calls; ``rel`` (a name a manifest gave) must stay inside the
        version (:func:`~components.export.manifest.store_rel`)."""
        rel = store_rel(rel, self.display_uri) if rel else ""
        return self.fs_path(_version_name(version), rel)

    def version_url(self, version: Optional[int] = None, rel: str = "") -> str:
        """Where a version or one of its files is (a local path, or the URL scrubbed of credentials), for
        messages and manifests."""
        path = self.version_path(version, rel)
        return redact(path if self.local else self.fs.unstrip_protocol(path))

    def _version_rel(self, version: int, rel: str) -> str:
        return f"{VERSION_NAME.format(version)}/{store_rel(rel, self.display_uri)}"

    def versions(self) -> list[int]:
        """The published versions (those with ``serving.json``), oldest first."""
        numbers = []
        for entry in self.list_dir():
            match = _VERSION.match(entry["name"].rstrip("/").rsplit("/", 1)[-1])
            if match and entry.get("type") == "directory" and self.is_file(match[0], MANIFEST):
                numbers.append(int(match[1]))
        return sorted(numbers)

    def latest(self) -> Optional[int]:
        versions = self.versions()
        return versions[-1] if versions else None

    def manifest(self, version: int) -> dict[str, Any]:
        manifest = self.read_json(VERSION_NAME.format(version), MANIFEST)
        if manifest is None:
            raise ServingModelError(f"{self.version_url(version)} is not a published version of the export store "
                                    f"{self.display_uri} (no {MANIFEST}); published: {self.versions()}")
        return manifest

    @contextlib.contextmanager
    def publishing(self, version: int) -> Iterator[Path]:
        """A local staging directory for ``version``, published when the block ends without an error and removed
        either way; the block writes ``serving.json`` into it last."""
        if self.local:
            Path(self.root).mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{VERSION_NAME.format(version)}.tmp-",
                                        dir=self.root if self.local else None))
        try:
            yield staging
            if not (staging / MANIFEST).is_file():
                raise ServingModelError(f"{staging}: the export wrote no {MANIFEST}: nothing to publish")
            self._clear_unpublished(version)
            if self.local:
                staging.chmod(0o755)  # mkdtemp makes it private
                staging.rename(self.version_path(version))
                return
            files = sorted(p for p in staging.rglob("*") if p.is_file() and p.name != MANIFEST)
            for local in files + [staging / MANIFEST]:  # serving.json last: it makes the version visible
                self.put_file(local, self._version_rel(version, local.relative_to(staging).as_posix()))
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _clear_unpublished(self, version: int) -> None:
        """Remove what an earlier, failed publication of ``version`` left; refuse to overwrite a published one."""
        if self.is_file(VERSION_NAME.format(version), MANIFEST):
            raise ServingModelError(f"{self.version_url(version)} is already published: another export wrote it "
                                    "meanwhile")
        self.remove_tree(VERSION_NAME.format(version))

    @contextlib.contextmanager
    def fetched(self, version: int, rel: str) -> Iterator[Path]:
        """A file of a version at a local path for the block: in place on a local store, else a downloaded copy
        removed after."""
        if self.local:
            yield local_file(Path(self.version_path(version)), rel)
            return
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / Path(rel).name
            self.get_file(self._version_rel(version, rel), local)
            yield local

    def local_dir(self, version: int, cache_dir: Optional[Path]) -> Path:
        """A local directory holding ``version``: in place on a local store, else downloaded into ``cache_dir``."""
        if self.local:
            return Path(self.version_path(version))
        if cache_dir is None:
            raise ValueError(f"{self.display_uri} is not local: give a directory to download its versions into")
        return self.download(version, Path(cache_dir) / VERSION_NAME.format(version))

    def download(self, version: int, out: Path) -> Path:
        """Every file of ``version`` into ``out``, its signature (when it has one) and ``serving.json`` last; the
        loader checks them. Every name ``serving.json`` gives stays inside ``out``."""
        manifest = self.manifest(version)
        signed = [SIGNATURE] if self.is_file(VERSION_NAME.format(version), SIGNATURE) else []
        for rel in sorted(manifest["files"]) + signed + [MANIFEST]:
            target = local_file(Path(out), rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            self.get_file(self._version_rel(version, rel), target)
        return Path(out)

    def copy_to(self, version: int, out: Path) -> Path:
        """``version`` as the directory ``out`` (absent, empty or an earlier serving model), staged beside it and
        renamed into place."""
        out = Path(out).absolute()
        check_replaceable(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            swap_in(self.download(version, staging), out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return out


def _version_name(version: Optional[int]) -> Optional[str]:
    return VERSION_NAME.format(version) if version is not None else None
