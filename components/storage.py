"""One storage layer under every store of the project (the checkpoint store, the export store): files under one
fsspec URL (a local path, ``file://``, ``s3://bucket/prefix``, ``hdfs://``, ``memory://``, ...), with retries, the
errors a user can act on, scrubbed messages, and digests.

Every remote operation is retried on transient errors (``OSError``, botocore/aiohttp connection errors,
timeouts) with exponential backoff ``backoff_s * 2**attempt``; when the tries run out it raises the store's
:attr:`Storage.Error` naming the file and URL. What no wait fixes (a full disk, a read-only filesystem, no
permission, no credentials, no such bucket) raises its :attr:`Storage.Refused` at once, naming the cause
(``ENOSPC``, ``EACCES``) and the file; a failed write leaves no temporary file behind. Credentials come only from
the environment (or ``storage_options``, never from config); messages and log lines are scrubbed of secret values
(credential environment variables, secret-looking ``storage_options``, ``user:password@`` in URLs).

A store built on this layer names its own error types (:attr:`Storage.Error`, :attr:`Storage.Refused`,
:attr:`Storage.Invalid`), so its callers catch what they always caught.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from components.redaction import redact
from components.safe_paths import UnsafePathError, check_rel
from components.storage_errors import (NO_CREDENTIALS, PERMANENT, PERMANENT_ERRNOS, TRANSIENT, InvalidStoreContent,
                                       StorageError, StorageRefused, reason)

log = logging.getLogger(__name__)

SMALL_FILE = 32 << 20  # sent or fetched in one request, hashed in memory
CHUNK = 8 << 20
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "oci", "tos", "memory"}
_COMMON_PROTOCOLS = "a local path, file://, s3://, hdfs://, webhdfs://, gs://, memory://"
# the object stores beyond S3 whose fsspec packages come as the package's extras (pyproject.toml)
STORE_EXTRAS = {"gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "adl": "azure"}
PROBE_PREFIX = "_probe-"  # the file Storage.probe writes and deletes

_sleep = time.sleep  # tests patch it


class Storage:
    """Files under one fsspec URL. ``retries`` is the number of tries in all for each remote operation (>= 1);
    between tries the store sleeps ``backoff_s * 2**attempt`` (attempt = 0, 1, ...). The filesystem's own retries
    (botocore's ``AWS_MAX_ATTEMPTS``, ``S3FileSystem.retries``) happen inside each try. ``workers`` files move at
    once in :meth:`_parallel`."""

    Error: type[Exception] = StorageError
    Refused: type[Exception] = StorageRefused
    Invalid: type[Exception] = InvalidStoreContent
    what = "store"  # what a message calls it
    within = "the store"  # where a relative name must stay (safe_paths)

    def __init__(self, uri: str, *, retries: int = 4, backoff_s: float = 0.5,
                 storage_options: dict | None = None, workers: int = 8):
        if retries < 1:
            raise ValueError(f"retries must be >= 1, got {retries}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.uri = str(uri)
        self.retries, self.backoff_s, self.workers = retries, backoff_s, workers
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = self._open_fs()
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        self._object_store = bool(set(protocols) & _OBJECT_STORES)
        self._local = "file" in protocols or "local" in protocols
        self._made_dirs: set[str] = set()
        self._dirs_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.display_uri!r})"

    def _open_fs(self) -> tuple[Any, str]:
        import fsspec
        from fsspec.core import url_to_fs

        uri, options = self.uri, self.storage_options
        if not uri:
            raise self.Error(f"empty {self.what} URI: use {_COMMON_PROTOCOLS}")
        protocol = uri.split("://", 1)[0] if "://" in uri else "file"
        try:
            fs, root = url_to_fs(uri, **options)
        except ValueError as e:
            if protocol not in fsspec.available_protocols():
                raise self.Error(redact(f"{self.what} {uri!r}: unknown protocol {protocol!r}; use "
                                        f"{_COMMON_PROTOCOLS}", options)) from None
            raise self.Error(redact(f"{self.what} {uri!r}: {e}", options)) from None
        except ImportError as e:
            extra = STORE_EXTRAS.get(protocol)
            how = f"pip install 'paddle-ps-pipelines[{extra}]'" if extra else "install it"
            raise self.Error(redact(f"{self.what} {uri!r}: protocol {protocol!r} needs a package that is not "
                                    f"installed ({e}): {how}", options)) from None
        return fs, root

    # -- names ----------------------------------------------------------------------------------------------

    @property
    def display_uri(self) -> str:
        return self._redact(self.uri)

    @property
    def local(self) -> bool:
        return self._local

    def fs_path(self, folder: str | None = None, rel: str = "") -> str:
        """The path of ``<folder>/<rel>`` in the store for ``self.fs`` calls."""
        parts = [self.root.rstrip("/")] + ([folder] if folder else []) + ([rel] if rel else [])
        return "/".join(parts) or "/"

    def url(self, folder: str | None = None, rel: str = "") -> str:
        """The full URL of a file or directory in the store (scrubbed of credentials)."""
        try:
            full = self.fs.unstrip_protocol(self.fs_path(folder, rel))
        except Exception:  # noqa: BLE001 - only for messages
            full = self.fs_path(folder, rel)
        return self._redact(full)

    def _redact(self, text: str) -> str:
        return redact(text, self.storage_options)

    def _check_rel(self, rel: str) -> str:
        """A relative file name that stays inside the store (:func:`components.safe_paths.check_rel`)."""
        try:
            return check_rel(rel, self.within)
        except UnsafePathError as err:
            raise self.Invalid(str(err)) from None

    # -- retries --------------------------------------------------------------------------------------------

    def _retry(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, tried up to ``self.retries`` times on transient errors; ``what`` names the operation. The
        store's own errors raised inside ``fn`` pass through untouched."""
        for attempt in range(self.retries):
            try:
                return fn()
            except (self.Error, self.Invalid):
                raise
            except (*PERMANENT, *NO_CREDENTIALS) as e:
                raise self.Refused(self._redact(f"{what} failed: {reason(e)}")) from None
            except TRANSIENT as e:
                why = self._redact(reason(e))
                if isinstance(e, OSError) and e.errno in PERMANENT_ERRNOS:
                    raise self.Refused(self._redact(f"{what} failed: {why}")) from None
                if attempt + 1 >= self.retries:
                    raise self.Error(self._redact(f"{what} failed after {self.retries} tries: {why}")) from None
                delay = self.backoff_s * 2 ** attempt
                log.warning("%s failed (try %d of %d): %s; retrying in %.2f s", self._redact(what), attempt + 1,
                            self.retries, why, delay)
                _sleep(delay)
        raise AssertionError("unreachable")

    def _parallel(self, jobs: list[tuple[str, Callable[[], Any]]]) -> dict[str, Any]:
        """``key -> fn()`` of every job, ``workers`` at once; on the first failure the jobs not started yet are
        dropped and the first failure in key order is raised."""
        results: dict[str, Any] = {}
        if not jobs:
            return results
        pool = ThreadPoolExecutor(max_workers=min(self.workers, len(jobs)), thread_name_prefix="store")
        try:
            futures = {pool.submit(fn): key for key, fn in jobs}
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                for f in pending:
                    f.cancel()
                wait(pending)
                first = min(failed, key=lambda f: futures[f])  # so the message is stable
                raise first.exception()
            for f in done:
                results[futures[f]] = f.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return dict(sorted(results.items()))

    # -- writing --------------------------------------------------------------------------------------------

    def ensure_parent(self, path: str) -> None:
        """Create the directory ``path`` goes into, where the filesystem has directories (not object stores)."""
        if self._object_store:
            return
        parent = path.rsplit("/", 1)[0]
        with self._dirs_lock:
            if parent in self._made_dirs:
                return
        self.fs.makedirs(parent, exist_ok=True)
        with self._dirs_lock:
            self._made_dirs.add(parent)

    def _put_once(self, local: Path, path: str) -> dict[str, Any]:
        """One try at sending ``local`` to ``path``, hashing the bytes as they are read (one read)."""
        self.ensure_parent(path)
        digest, size = hashlib.sha256(), 0
        if local.stat().st_size <= SMALL_FILE:
            data = local.read_bytes()
            digest.update(data)
            self.fs.pipe_file(path, data)
            return {"size": len(data), "sha256": digest.hexdigest()}
        out = self.fs.open(path, "wb", block_size=max(CHUNK, 5 << 20))
        try:
            with open(local, "rb") as src:
                for chunk in iter(lambda: src.read(CHUNK), b""):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            out.close()
        except BaseException:
            self._discard(out, path)
            raise
        return {"size": size, "sha256": digest.hexdigest()}

    def _discard(self, out: Any, path: str) -> None:
        """Throw away a half-written remote file (best effort: the endpoint may be gone)."""
        try:
            discard = getattr(out, "discard", None)
            if callable(discard):
                discard()
        except Exception:  # noqa: BLE001
            pass
        if hasattr(out, "buffer") and hasattr(out, "closed"):
            try:
                out.closed = True  # fsspec buffered files would otherwise commit the partial data on __del__
            except Exception:  # noqa: BLE001
                pass
        else:
            try:
                out.close()
            except Exception:  # noqa: BLE001
                pass
        try:
            self.fs.rm_file(path)
        except Exception:  # noqa: BLE001
            pass

    def send_file(self, local: str | os.PathLike, folder: str | None, rel: str) -> dict[str, Any]:
        """Upload ``local`` to ``<folder>/<rel>``, hashed as it is read; returns ``{"size", "sha256"}`` of the
        bytes sent."""
        local, rel = Path(local), self._check_rel(rel)
        path = self.fs_path(folder, rel)
        return self._retry(f"uploading {local} to {self.url(folder, rel)}", lambda: self._put_once(local, path))

    def write_json(self, folder: str | None, rel: str, payload: Any) -> dict[str, Any]:
        """A small control file in one write (renamed into place on a local disk: a reader never sees half a
        file); returns its ``{"size", "sha256"}``."""
        data = (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()
        rel = self._check_rel(rel)
        path = self.fs_path(folder, rel)

        def put() -> None:
            self.ensure_parent(path)
            if self._local:
                tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
                try:
                    self.fs.pipe_file(tmp, data)
                    os.replace(tmp, path)
                finally:  # a failed write (a full disk) leaves no temporary file behind
                    _remove_quietly(tmp)
            else:  # object stores: a PUT is atomic
                self.fs.pipe_file(path, data)

        self._retry(f"writing {self.url(folder, rel)}", put)
        return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def create_json(self, rel: str, payload: Any) -> bool:
        """A small control file written only if none exists yet; False when one does.

        Atomic where the store allows it: a hard link on a local disk, a conditional PUT (``If-None-Match``) on
        S3. Other filesystems check first and then write (two writers racing within one round trip can both win).
        """
        data = (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()
        rel = self._check_rel(rel)
        path = self.fs_path(None, rel)

        def create() -> bool:
            self.ensure_parent(path)
            try:
                if self._local:  # link(2) fails if the name exists: the whole file appears at once, or not
                    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
                    try:
                        self.fs.pipe_file(tmp, data)
                        os.link(tmp, path)
                    finally:
                        _remove_quietly(tmp)
                else:
                    self.fs.pipe_file(path, data, mode="create")
            except FileExistsError:
                return False
            return True

        return self._retry(f"creating {self.url(None, rel)}", create)

    def remove(self, rel: str) -> None:
        """Delete a file (missing is fine)."""
        path = self.fs_path(None, self._check_rel(rel))

        def rm() -> None:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

        self._retry(f"deleting {self.url(None, rel)}", rm)

    def put_file(self, local: str | os.PathLike, rel: str) -> None:
        """Upload the file ``local`` to ``rel``, retried like every write: a store that refuses it (a full disk,
        no permission) raises :attr:`Refused` naming the cause."""
        path = self.fs_path(None, self._check_rel(rel))

        def put() -> None:
            self.ensure_parent(path)
            self.fs.put_file(str(local), path)

        self._retry(f"uploading {local} to {self.url(None, rel)}", put)

    def get_file(self, rel: str, local: str | os.PathLike) -> None:
        """Download ``rel`` to the file ``local``."""
        path = self.fs_path(None, self._check_rel(rel))
        self._retry(f"downloading {self.url(None, rel)}", lambda: self.fs.get_file(path, str(local)))

    def put_bytes(self, rel: str, data: bytes) -> None:
        path = self.fs_path(None, self._check_rel(rel))

        def put() -> None:
            self.ensure_parent(path)
            self.fs.pipe_file(path, data)

        self._retry(f"writing {self.url(None, rel)}", put)

    def get_bytes(self, rel: str) -> bytes:
        path = self.fs_path(None, self._check_rel(rel))
        return self._retry(f"reading {self.url(None, rel)}", lambda: self.fs.cat_file(path))

    def remove_tree(self, rel: str) -> None:
        """Remove the folder (or file) ``rel`` and everything below it; absent is fine."""
        path = self.fs_path(None, self._check_rel(rel))

        def rm() -> None:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)

        self._retry(f"deleting {self.url(None, rel)}", rm)

    def probe(self) -> None:
        """Write, read back and delete a small file: a store this job cannot use (no such bucket, no permission,
        a read-only or missing directory, no endpoint) fails here, before anything expensive starts, with
        :attr:`Error` naming the store and what failed."""
        rel = f"{PROBE_PREFIX}{uuid.uuid4().hex[:12]}.json"
        payload = {"probe": rel}
        # A local store's directories that do not exist yet: made by the write, removed again afterwards.
        missing = [p for p in (Path(self.root), *Path(self.root).parents) if not p.exists()] if self._local else []
        failed = True
        try:
            self.write_json(None, rel, payload)
            back = self.read_json(None, rel)
            if back != payload:
                raise self.Error(f"{self.what} {self.display_uri}: a file written to {self.url(None, rel)} read "
                                 f"back as {back!r}")
            failed = False
        finally:
            try:
                self.remove(rel)
            except self.Error as e:
                if not failed:  # else the error on its way out names what is wrong with the store, in one line
                    log.warning("cannot delete the probe file: %s", e)
            for directory in missing:  # deepest first
                try:
                    directory.rmdir()
                except OSError:
                    break
            self._made_dirs.clear()

    # -- reading --------------------------------------------------------------------------------------------

    def read_json(self, folder: str | None, rel: str) -> Any:
        """A small control file's content, or ``None`` if it does not exist."""
        return self._read_json(folder, rel)[0]

    def _read_json(self, folder: str | None, rel: str) -> tuple[Any, bytes | None]:
        """``(content, the bytes read)``; ``(None, None)`` if the file does not exist."""
        rel = self._check_rel(rel)
        path, url = self.fs_path(folder, rel), self.url(folder, rel)

        def get() -> bytes | None:
            try:
                return self.fs.cat_file(path)
            except FileNotFoundError:
                return None

        data = self._retry(f"reading {url}", get)
        if data is None:
            return None, None
        try:
            return json.loads(data), data
        except ValueError as e:
            raise self.Invalid(f"{url} is not valid JSON ({e}): truncated or altered") from None

    def list_control(self, folder: str) -> list[str]:
        """Names of the entries of a folder, sorted; [] if none."""
        path = self.fs_path(None, self._check_rel(folder))

        def ls() -> list[str]:
            self.fs.invalidate_cache()
            try:
                return self.fs.ls(path, detail=False)
            except FileNotFoundError:
                return []

        return sorted(PurePosixPath(p).name for p in self._retry(f"listing {self.url(None, folder)}", ls))

    def list_dir(self, folder: str | None = None) -> list[dict[str, Any]]:
        """The entries of ``folder`` (the root by default) with their details; [] if it does not exist."""
        path = self.fs_path(folder)

        def ls() -> list[dict[str, Any]]:
            self.fs.invalidate_cache()
            try:
                return self.fs.ls(path, detail=True)
            except FileNotFoundError:
                return []

        return self._retry(f"listing {self.url(folder)}", ls)

    def stored_sizes(self, folder: str, prefix: str = "") -> dict[str, int]:
        """Relative name -> size in bytes of the files stored under ``<folder>/<prefix>`` (one listing)."""
        base = self.fs_path(folder)
        top = self.fs_path(folder, self._check_rel(prefix)) if prefix.strip("/") else base

        def find() -> dict[str, Any]:
            self.fs.invalidate_cache()
            try:
                return self.fs.find(top, detail=True)
            except FileNotFoundError:
                return {}

        found = self._retry(f"listing {self.url(folder, prefix.strip('/'))}", find)
        out = {}
        for name, info in found.items():
            name = name.rstrip("/")
            if info.get("type", "file") == "file" and name.startswith(base + "/"):
                out[name[len(base) + 1:]] = int(info.get("size") or 0)
        return out

    def is_file(self, folder: str | None, rel: str) -> bool:
        """Whether ``<folder>/<rel>`` is a file; an unreachable store raises (not fs.isfile/exists, which answer
        False when the endpoint is down)."""
        path = self.fs_path(folder, rel)

        def is_file() -> bool:
            try:
                return self.fs.info(path).get("type") == "file"
            except FileNotFoundError:
                return False

        return self._retry(f"checking {self.url(folder, rel)}", is_file)

    def digest(self, folder: str | None, rel: str) -> tuple[int, str]:
        """``(bytes, sha256 hex)`` of a stored file, streamed in blocks (nothing is written locally); a missing file
        raises :meth:`missing`'s error."""
        path, url = self.fs_path(folder, self._check_rel(rel)), self.url(folder, rel)

        def read() -> tuple[int, str]:
            digest, size = hashlib.sha256(), 0
            try:
                with self.fs.open(path, "rb", block_size=CHUNK) as f:
                    for block in iter(lambda: f.read(CHUNK), b""):
                        digest.update(block)
                        size += len(block)
            except FileNotFoundError:
                raise self.missing(url) from None
            return size, digest.hexdigest()

        return self._retry(f"reading {url}", read)

    def missing(self, url: str) -> Exception:
        """The error for a file the store should hold and does not."""
        return self.Invalid(f"{url} is missing")


def _remove_quietly(path: str) -> None:
    """Remove a local file if it is there (gone already after a rename)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
