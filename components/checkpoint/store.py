"""Checkpoints on any fsspec URL: transport, commit protocol, ``LATEST`` pointer, pruning, verified restore.

Layout under the store URI (a local path, ``file://``, ``s3://bucket/prefix``, ``hdfs://``, ``webhdfs://``,
``memory://``, ...)::

    <uri>/<ckpt_id>/tables/NNN/part-*.gz  ...    the checkpoint's files, uploaded in any order
    <uri>/<ckpt_id>/model.json                   the checkpoint's meta (written by :meth:`CheckpointStore.commit`)
    <uri>/<ckpt_id>/MANIFEST.json                written LAST: every file with size and sha256
    <uri>/LATEST                                 ``{"id": <ckpt_id>}``, moved only after a manifest is written
    <uri>/BEST                                   ``{"id": <ckpt_id>}``: the best on the validation split, if any

A checkpoint directory without ``MANIFEST.json`` is invisible: it is never listed as committed, never
resolved, never downloaded, and :meth:`CheckpointStore.cleanup_incomplete` removes it. So an upload that dies
half way (pod killed, endpoint gone) leaves nothing a reader could pick up.

Checkpoint ids are made by :func:`make_id` (``<UTC time to the microsecond>Z-e<epoch>-s<step>``): they sort
in creation order, which is what :meth:`CheckpointStore.committed`, :meth:`CheckpointStore.latest` (when
``LATEST`` is unusable) and :meth:`CheckpointStore.prune` rely on, so the store writes no other ids, and it
never deletes a directory whose name is not such an id (a store URI pointed at a shared prefix cannot wipe
foreign data).

Every remote operation is retried on transient errors (``OSError``, botocore/aiohttp connection errors,
timeouts) with exponential backoff ``backoff_s * 2**attempt``; when the tries run out it raises
:class:`CheckpointStoreError` naming the file and URL. What no wait fixes (a full disk, a read-only filesystem,
no permission, no credentials, no such bucket) raises :class:`StoreRefused` at once, naming the cause (``ENOSPC``,
``EACCES``) and the file; a failed write leaves no temporary file behind. Credentials come only from the
environment (or ``storage_options``, never from config); messages and log lines are scrubbed of secret values
(credential environment variables, secret-looking ``storage_options``, ``user:password@`` in URLs).

Every file is hashed while it is uploaded (one read of the local file), and checked against the manifest
(size and sha256) when it is downloaded. A downloaded checkpoint directory holds ``MANIFEST.json`` and
``model.json`` (the store's manifest, byte for byte), so :func:`components.checkpoint.format.load` / ``verify``
read it like a locally committed one.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable

from components.checkpoint.format import (MANIFEST, MODEL_META, CheckpointError, checkpoint_file,
                                          file_digest)
from components.redaction import redact
from components.safe_paths import UnsafePathError, check_rel

log = logging.getLogger(__name__)

LATEST = "LATEST"
BEST = "BEST"
FORMAT = 1
# Files up to this size are read whole, hashed and sent in one request; bigger ones are streamed.
SMALL_FILE = 32 << 20
CHUNK = 8 << 20
# Object stores: no directories to create, and a PUT is atomic.
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "oci", "tos", "memory"}
_COMMON_PROTOCOLS = "a local path, file://, s3://, hdfs://, webhdfs://, gs://, memory://"

PROBE_PREFIX = "_probe-"  # the file CheckpointStore.probe writes and deletes
ID_RE = re.compile(r"^(?P<time>\d{8}T\d{12})Z-e(?P<epoch>\d{4,})-s(?P<step>\d{10,})$")
_id_lock = threading.Lock()
_last_id_us = 0

# Indirection so tests can record the backoff without patching time.sleep for every thread.
_sleep = time.sleep


class CheckpointStoreError(CheckpointError):
    """A transport failure (after retries) or an unusable store URI; names the file and URL, never credentials."""


class StoreRefused(CheckpointStoreError):
    """The store refused an operation for a reason no retry fixes: no space left, no permission, no credentials, no
    such file or bucket."""


def make_id(epoch: int, step: int, *, now: _dt.datetime | None = None) -> str:
    """A checkpoint id that sorts in creation order: ``20261129T163935123456Z-e0003-s0000001200``.

    Within a process ids are strictly increasing even if the clock stalls or steps back.
    """
    global _last_id_us
    if epoch < 0 or step < 0:
        raise ValueError(f"make_id: epoch and step must be >= 0, got {epoch}, {step}")
    now = (now or _dt.datetime.now(_dt.timezone.utc)).astimezone(_dt.timezone.utc)
    micros = int((now - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)) / _dt.timedelta(microseconds=1))
    with _id_lock:
        micros = max(micros, _last_id_us + 1)
        _last_id_us = micros
    stamp = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc) + _dt.timedelta(microseconds=micros)
    return f"{stamp:%Y%m%dT%H%M%S}{stamp.microsecond:06d}Z-e{epoch:04d}-s{step:010d}"


def _match_id(ckpt_id: Any) -> re.Match:
    match = ID_RE.match(ckpt_id) if isinstance(ckpt_id, str) else None
    if match is None:
        raise ValueError(f"{ckpt_id!r} is not a checkpoint id (made by make_id)")
    return match


def parse_id(ckpt_id: str) -> tuple[int, int]:
    """``(epoch, step)`` of an id made by :func:`make_id`."""
    match = _match_id(ckpt_id)
    return int(match["epoch"]), int(match["step"])


def id_time(ckpt_id: str) -> _dt.datetime:
    """When :func:`make_id` made the id (UTC, to the microsecond)."""
    stamp = _dt.datetime.strptime(_match_id(ckpt_id)["time"], "%Y%m%dT%H%M%S%f")
    return stamp.replace(tzinfo=_dt.timezone.utc)


# ---------------------------------------------------------------------------------------------------------
# errors: which are worth retrying, and scrubbing secrets out of messages


def _transient_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [OSError, TimeoutError]
    try:
        from fsspec.exceptions import FSTimeoutError
        types.append(FSTimeoutError)
    except ImportError:  # pragma: no cover
        pass
    try:
        import botocore.exceptions as bce
        types += [bce.ConnectionError, bce.HTTPClientError, bce.IncompleteReadError]
    except ImportError:  # pragma: no cover
        pass
    try:
        import aiohttp
        types.append(aiohttp.ClientError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


def _no_credentials_types() -> tuple[type[BaseException], ...]:
    try:
        import botocore.exceptions as bce
    except ImportError:  # pragma: no cover
        return ()
    return bce.NoCredentialsError, bce.PartialCredentialsError


_TRANSIENT = _transient_types()
# OSErrors that retrying cannot fix (missing bucket/key, access denied, a directory where a file goes).
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
# ... and by errno (plain OSErrors): a full disk or quota, a read-only filesystem; retried, they would be blamed on
# an unreachable store once a job's lease ran out.
_PERMANENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
# No credentials found (botocore): an S3 store the environment holds no keys for.
_NO_CREDENTIALS = _no_credentials_types()
def _reason(exc: BaseException) -> str:
    message = str(exc).strip()
    if isinstance(exc, OSError) and exc.errno in errno.errorcode:  # the symbol people search for: ENOSPC, EACCES
        message = f"{message} ({errno.errorcode[exc.errno]})"
    if isinstance(exc, _NO_CREDENTIALS):
        message += ": set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for this store"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _check_rel(rel: str) -> str:
    """A relative file name inside a checkpoint (:func:`components.safe_paths.check_rel`), as a CheckpointError:
    what every caller of the checkpoint store already handles."""
    try:
        return check_rel(rel, "a checkpoint")
    except UnsafePathError as err:
        raise CheckpointError(str(err)) from None


# ---------------------------------------------------------------------------------------------------------


class CheckpointStore:
    """Checkpoints under one fsspec URL. Single writer; any number of readers.

    ``retries`` is the number of tries in all for each remote operation (>= 1); between tries the store sleeps
    ``backoff_s * 2**attempt`` (attempt = 0, 1, ...). The filesystem's own retries (botocore's
    ``AWS_MAX_ATTEMPTS``, ``S3FileSystem.retries``) happen inside each try. ``workers`` files move at
    once in :meth:`upload_dir` / :meth:`download`.
    """

    def __init__(self, uri: str, *, retries: int = 4, backoff_s: float = 0.5,
                 storage_options: dict | None = None, workers: int = 8):
        if retries < 1:
            raise ValueError(f"retries must be >= 1, got {retries}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.uri = str(uri)
        self.retries, self.backoff_s, self.workers = retries, backoff_s, workers
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = _open_fs(self.uri, self.storage_options)
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        self._object_store = bool(set(protocols) & _OBJECT_STORES)
        self._local = "file" in protocols or "local" in protocols
        self._made_dirs: set[str] = set()
        self._dirs_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CheckpointStore({self.display_uri!r})"

    # -- names ----------------------------------------------------------------------------------------------

    @property
    def display_uri(self) -> str:
        return self._redact(self.uri)

    def fs_path(self, ckpt_id: str | None = None, rel: str = "") -> str:
        """The path of a file in the store for ``self.fs`` calls (scratch files outside checkpoints)."""
        parts = [self.root.rstrip("/")] + ([ckpt_id] if ckpt_id else []) + ([rel] if rel else [])
        return "/".join(parts) or "/"

    def url(self, ckpt_id: str | None = None, rel: str = "") -> str:
        """The full URL of a file or directory in the store (scrubbed of credentials)."""
        try:
            full = self.fs.unstrip_protocol(self.fs_path(ckpt_id, rel))
        except Exception:  # noqa: BLE001 - only for messages
            full = self.fs_path(ckpt_id, rel)
        return self._redact(full)

    def _redact(self, text: str) -> str:
        return redact(text, self.storage_options)

    @staticmethod
    def _check_new_id(ckpt_id: str) -> str:
        if not isinstance(ckpt_id, str) or not ID_RE.match(ckpt_id):
            raise CheckpointError(f"checkpoint id {ckpt_id!r} was not made by make_id(epoch, step): the store "
                                  "writes only ids that sort in creation order")
        return ckpt_id

    # -- retries --------------------------------------------------------------------------------------------

    def _retry(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, tried up to ``self.retries`` times on transient errors; ``what`` names the operation."""
        for attempt in range(self.retries):
            try:
                return fn()
            except CheckpointError:
                raise
            except (*_PERMANENT, *_NO_CREDENTIALS) as e:
                raise StoreRefused(self._redact(f"{what} failed: {_reason(e)}")) from None
            except _TRANSIENT as e:
                reason = self._redact(_reason(e))
                if isinstance(e, OSError) and e.errno in _PERMANENT_ERRNOS:
                    raise StoreRefused(self._redact(f"{what} failed: {reason}")) from None
                if attempt + 1 >= self.retries:
                    raise CheckpointStoreError(
                        self._redact(f"{what} failed after {self.retries} tries: {reason}")) from None
                delay = self.backoff_s * 2 ** attempt
                log.warning("%s failed (try %d of %d): %s; retrying in %.2f s", self._redact(what), attempt + 1,
                            self.retries, reason, delay)
                _sleep(delay)
        raise AssertionError("unreachable")

    # -- files ----------------------------------------------------------------------------------------------

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

    def upload_file(self, local: str | os.PathLike, ckpt_id: str, rel: str) -> dict[str, Any]:
        """Send one file to ``<uri>/<ckpt_id>/<rel>``; returns ``{"size", "sha256"}`` of the bytes sent."""
        local = Path(local)
        self._check_new_id(ckpt_id)
        rel = _check_rel(rel)
        if rel == MANIFEST:
            raise CheckpointError(f"{MANIFEST} is written by commit(), never uploaded: it makes the checkpoint "
                                  "visible")
        if not local.is_file():
            raise CheckpointError(f"cannot upload {local}: not a file")
        path = self.fs_path(ckpt_id, rel)
        return self._retry(f"uploading {local} to {self.url(ckpt_id, rel)}", lambda: self._put_once(local, path))

    def upload_dir(self, local_dir: str | os.PathLike, ckpt_id: str, prefix: str = "") -> dict[str, dict[str, Any]]:
        """Send every file under ``local_dir`` (``workers`` at once) to ``<uri>/<ckpt_id>/<prefix>/...``.

        Returns ``rel path -> {"size", "sha256"}``, the ``files`` for :meth:`commit`. A top-level
        ``MANIFEST.json`` in ``local_dir`` is skipped (only :meth:`commit` writes one). On the first failure
        the files not started yet are dropped and the error is raised; nothing becomes visible.
        """
        local_dir = Path(local_dir)
        self._check_new_id(ckpt_id)
        if not local_dir.is_dir():
            raise CheckpointError(f"cannot upload {local_dir}: not a directory")
        if self._has_manifest(ckpt_id):
            raise CheckpointError(f"{self.url(ckpt_id)} is already committed: a checkpoint is never changed "
                                  "after its manifest is written (make a new id with make_id)")
        prefix = _check_rel(prefix) + "/" if prefix.strip("/") else ""
        jobs = []
        for p in sorted(local_dir.rglob("*")):
            if not p.is_file():
                continue
            rel = prefix + p.relative_to(local_dir).as_posix()
            if rel == MANIFEST:
                log.info("not uploading %s: the store writes its own %s at commit", p, MANIFEST)
                continue
            jobs.append((p, rel))
        return self._parallel([(rel, (lambda p=p, rel=rel: self.upload_file(p, ckpt_id, rel))) for p, rel in jobs])

    def _parallel(self, jobs: list[tuple[str, Callable[[], Any]]]) -> dict[str, Any]:
        results: dict[str, Any] = {}
        if not jobs:
            return results
        pool = ThreadPoolExecutor(max_workers=min(self.workers, len(jobs)), thread_name_prefix="ckpt-store")
        try:
            futures = {pool.submit(fn): key for key, fn in jobs}
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                for f in pending:
                    f.cancel()
                wait(pending)
                # The first failure in file order, so the message is stable.
                first = min(failed, key=lambda f: futures[f])
                raise first.exception()
            for f in done:
                results[futures[f]] = f.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return dict(sorted(results.items()))

    def write_json(self, ckpt_id: str | None, rel: str, payload: Any) -> dict[str, Any]:
        """A small control file (``LATEST``, ``model.json``, the manifest) in one write; returns its entry."""
        data = (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()
        rel = _check_rel(rel)
        path = self.fs_path(ckpt_id, rel)

        def put() -> None:
            self.ensure_parent(path)
            if self._local:  # rename: a reader never sees half a file
                tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
                try:
                    self.fs.pipe_file(tmp, data)
                    os.replace(tmp, path)
                finally:  # a failed write (a full disk) leaves no temporary file behind
                    _remove_quietly(tmp)
            else:  # object stores: a PUT is atomic
                self.fs.pipe_file(path, data)

        self._retry(f"writing {self.url(ckpt_id, rel)}", put)
        return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def create_json(self, rel: str, payload: Any) -> bool:
        """A small control file written only if none exists yet; False when one does.

        Atomic where the store allows it: a hard link on a local disk, a conditional PUT (``If-None-Match``) on
        S3. Other filesystems check first and then write (two writers racing within one round trip can both win).
        """
        data = (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()
        rel = _check_rel(rel)
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
        """Delete a control file outside the checkpoints (missing is fine)."""
        path = self.fs_path(None, _check_rel(rel))

        def rm() -> None:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

        self._retry(f"deleting {self.url(None, rel)}", rm)

    # -- the job's exchange area (control folders beside the checkpoints: worker parts, score parts, the day ledger) --

    def put_file(self, local: str | os.PathLike, rel: str) -> None:
        """Upload the file ``local`` to ``rel`` (a path of the store outside any checkpoint), retried like every
        write: a store that refuses it (a full disk, no permission) raises :class:`StoreRefused` naming the cause."""
        path = self.fs_path(None, _check_rel(rel))

        def put() -> None:
            self.ensure_parent(path)
            self.fs.put_file(str(local), path)

        self._retry(f"uploading {local} to {self.url(None, rel)}", put)

    def get_file(self, rel: str, local: str | os.PathLike) -> None:
        """Download ``rel`` (outside any checkpoint) to the file ``local``."""
        path = self.fs_path(None, _check_rel(rel))
        self._retry(f"downloading {self.url(None, rel)}", lambda: self.fs.get_file(path, str(local)))

    def put_bytes(self, rel: str, data: bytes) -> None:
        path = self.fs_path(None, _check_rel(rel))

        def put() -> None:
            self.ensure_parent(path)
            self.fs.pipe_file(path, data)

        self._retry(f"writing {self.url(None, rel)}", put)

    def get_bytes(self, rel: str) -> bytes:
        path = self.fs_path(None, _check_rel(rel))
        return self._retry(f"reading {self.url(None, rel)}", lambda: self.fs.cat_file(path))

    def remove_tree(self, rel: str) -> None:
        """Remove the folder (or file) ``rel`` outside any checkpoint, and everything below it; absent is fine."""
        path = self.fs_path(None, _check_rel(rel))

        def rm() -> None:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)

        self._retry(f"deleting {self.url(None, rel)}", rm)

    def probe(self) -> None:
        """Write, read back and delete a small file: a store this job cannot use (no such bucket, no permission,
        a read-only or missing directory, no endpoint) fails here, before anything expensive starts.

        Raises :class:`CheckpointStoreError` naming the store and what failed.
        """
        rel = f"{PROBE_PREFIX}{uuid.uuid4().hex[:12]}.json"
        payload = {"probe": rel}
        # A local store's directories that do not exist yet: made by the write, removed again afterwards.
        missing = [p for p in (Path(self.root), *Path(self.root).parents) if not p.exists()] if self._local else []
        failed = True
        try:
            self.write_json(None, rel, payload)
            back = self.read_json(None, rel)
            if back != payload:
                raise CheckpointStoreError(f"checkpoint store {self.display_uri}: a file written to "
                                           f"{self.url(None, rel)} read back as {back!r}")
            failed = False
        finally:
            try:
                self.remove(rel)
            except CheckpointStoreError as e:
                if not failed:  # else the error on its way out names what is wrong with the store, in one line
                    log.warning("cannot delete the probe file: %s", e)
            for directory in missing:  # deepest first
                try:
                    directory.rmdir()
                except OSError:
                    break
            self._made_dirs.clear()

    def read_json(self, ckpt_id: str | None, rel: str) -> Any:
        """A small control file's content, or ``None`` if it does not exist."""
        return self._read_json(ckpt_id, rel)[0]

    def _read_json(self, ckpt_id: str | None, rel: str) -> tuple[Any, bytes | None]:
        """``(content, the bytes read)``; ``(None, None)`` if the file does not exist."""
        rel = _check_rel(rel)
        path, url = self.fs_path(ckpt_id, rel), self.url(ckpt_id, rel)

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
            raise CheckpointError(f"{url} is not valid JSON ({e}): truncated or altered") from None

    def list_control(self, folder: str) -> list[str]:
        """Names of the files in a control folder outside the checkpoints (``_upload``), sorted; [] if none."""
        path = self.fs_path(None, _check_rel(folder))

        def ls() -> list[str]:
            self.fs.invalidate_cache()
            try:
                return self.fs.ls(path, detail=False)
            except FileNotFoundError:
                return []

        return sorted(PurePosixPath(p).name for p in self._retry(f"listing {self.url(None, folder)}", ls))

    def list_files(self, ckpt_id: str, prefix: str = "") -> list[str]:
        """Relative names of the files stored under ``<uri>/<ckpt_id>/<prefix>`` (committed or not)."""
        return sorted(self.stored_sizes(ckpt_id, prefix))

    def stored_sizes(self, ckpt_id: str, prefix: str = "") -> dict[str, int]:
        """Relative name -> size in bytes of the files stored under ``<uri>/<ckpt_id>/<prefix>`` (one listing)."""
        base = self.fs_path(ckpt_id)
        top = self.fs_path(ckpt_id, _check_rel(prefix)) if prefix.strip("/") else base

        def find() -> dict[str, Any]:
            self.fs.invalidate_cache()
            try:
                return self.fs.find(top, detail=True)
            except FileNotFoundError:
                return {}

        found = self._retry(f"listing {self.url(ckpt_id, prefix.strip('/'))}", find)
        out = {}
        for name, info in found.items():
            name = name.rstrip("/")
            if info.get("type", "file") == "file" and name.startswith(base + "/"):
                out[name[len(base) + 1:]] = int(info.get("size") or 0)
        return out

    # -- commit protocol -----------------------------------------------------------------------------------

    def commit(self, ckpt_id: str, files: dict[str, dict[str, Any]], meta: dict[str, Any], *,
               set_latest: bool = True) -> dict[str, Any]:
        """Make an uploaded checkpoint visible: ``model.json`` (meta), then the manifest, then ``LATEST``.

        ``files`` are the uploads' entries (:meth:`upload_dir` / :meth:`upload_file`). Before the manifest is
        written every file in it is checked to be in the store with its size, so a manifest never names a
        file that did not land. Returns the manifest.
        """
        self._check_new_id(ckpt_id)
        files = {_check_rel(rel): {"size": int(e["size"]), "sha256": str(e["sha256"])} for rel, e in files.items()}
        files.pop(MANIFEST, None)
        files[MODEL_META] = self.write_json(ckpt_id, MODEL_META, meta)
        stored = self.stored_sizes(ckpt_id)
        for rel, entry in sorted(files.items()):
            if rel not in stored:
                raise CheckpointStoreError(f"cannot commit {self.url(ckpt_id)}: {self.url(ckpt_id, rel)} was "
                                           "not uploaded")
            if stored[rel] != entry["size"]:
                raise CheckpointStoreError(f"cannot commit {self.url(ckpt_id)}: {self.url(ckpt_id, rel)} holds "
                                           f"{stored[rel]} bytes, the upload sent {entry['size']}")
        summary = {k: v for k, v in meta.items() if v is None or isinstance(v, (str, int, float, bool))}
        manifest = {
            "format": FORMAT,
            "id": ckpt_id,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "paddle_version": meta.get("paddle_version"),
            "meta": summary,
            "files": dict(sorted(files.items())),
        }
        self.write_json(ckpt_id, MANIFEST, manifest)
        if set_latest:
            self.write_json(None, LATEST, {"id": ckpt_id})
        log.info("committed checkpoint %s (%d files, %d bytes)", self.url(ckpt_id), len(files),
                 sum(e["size"] for e in files.values()))
        return manifest

    def _ids(self) -> list[str]:
        """Names of the checkpoint directories (made by :func:`make_id`), committed or not, sorted."""

        def ls() -> list[dict[str, Any]]:
            self.fs.invalidate_cache()
            try:
                return self.fs.ls(self.root, detail=True)
            except FileNotFoundError:
                return []

        entries = self._retry(f"listing {self.url()}", ls)
        names = {e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory"}
        return sorted(n for n in names if ID_RE.match(n))

    def _has_manifest(self, ckpt_id: str) -> bool:
        path = self.fs_path(ckpt_id, MANIFEST)

        def is_file() -> bool:
            # not fs.isfile/exists: they answer False when the endpoint is down, which would make every
            # checkpoint look incomplete (and cleanup_incomplete delete it)
            try:
                return self.fs.info(path).get("type") == "file"
            except FileNotFoundError:
                return False

        return self._retry(f"checking {self.url(ckpt_id, MANIFEST)}", is_file)

    def committed(self) -> list[str]:
        """Ids of the committed checkpoints (those with a manifest), oldest first."""
        return [i for i in self._ids() if self._has_manifest(i)]

    def latest(self) -> str | None:
        """The id ``LATEST`` names if that checkpoint is committed, else the newest committed one, else None."""
        ids = self.committed()
        if not ids:
            return None
        try:
            pointer = self.read_json(None, LATEST)
        except CheckpointStoreError:
            raise
        except CheckpointError as e:
            log.warning("ignoring %s: %s", self.url(None, LATEST), e)
            pointer = None
        named = pointer.get("id") if isinstance(pointer, dict) else None
        if named in ids:
            return named
        if named is not None:
            log.warning("%s names %r, which is not a committed checkpoint; using the newest committed, %s",
                        self.url(None, LATEST), named, ids[-1])
        return ids[-1]

    def resolve(self, resume: str | None) -> str | None:
        """``"none"`` -> None; ``"latest"`` -> :meth:`latest`; ``"auto"`` -> :meth:`latest`, or None on a store
        with no committed checkpoint; an id -> that id.

        ``latest`` on a store with no committed checkpoint, or an id that is not committed, raises
        :class:`CheckpointError` (listing the committed ids): a resume that cannot resume must not quietly
        train from scratch.
        """
        key = (resume or "none").strip()
        if key.lower() == "none":
            return None
        if key.lower() in ("latest", "auto"):
            latest = self.latest()
            if latest is None and key.lower() == "latest":
                raise CheckpointError(f"{self.display_uri} holds no committed checkpoint to resume (latest): point "
                                      "checkpoint.uri at the store of the run to continue, or use "
                                      "checkpoint.resume=auto to start fresh when the store is empty")
            return latest
        ids = self.committed()
        if key in ids:
            return key
        raise CheckpointError(f"checkpoint {key!r} is not a committed checkpoint in {self.display_uri}; "
                              f"committed: {', '.join(ids) if ids else '(none)'}")

    def _delete(self, ckpt_id: str) -> None:
        """Remove a checkpoint directory: its manifest first, so a half-done delete leaves nothing visible."""
        manifest = self.fs_path(ckpt_id, MANIFEST)

        def rm_manifest() -> None:
            try:
                self.fs.rm_file(manifest)
            except FileNotFoundError:
                pass

        def rm_dir() -> None:
            try:
                self.fs.rm(self.fs_path(ckpt_id), recursive=True)
            except FileNotFoundError:
                pass

        self._retry(f"deleting {self.url(ckpt_id, MANIFEST)}", rm_manifest)
        self._retry(f"deleting {self.url(ckpt_id)}", rm_dir)
        self.fs.invalidate_cache()

    def best(self) -> str | None:
        """The committed checkpoint ``BEST`` names (the best on the validation split), else None."""
        pointer = self.read_json(None, BEST)
        named = pointer.get("id") if isinstance(pointer, dict) else None
        return named if named is not None and self._has_manifest(named) else None

    def mark_best(self, ckpt_id: str) -> None:
        """Point ``BEST`` at a committed checkpoint: pruning keeps it."""
        if not self._has_manifest(ckpt_id):
            raise CheckpointError(f"{self.url(ckpt_id)} is not committed: it cannot be the best")
        self.write_json(None, BEST, {"id": ckpt_id})

    def prune(self, keep_last: int) -> list[str]:
        """Delete the oldest committed checkpoints beyond the newest ``keep_last``, never the ones ``LATEST`` and
        ``BEST`` name; returns the deleted ids."""
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        ids = self.committed()
        keep = {self.latest(), self.best()}
        victims = [i for i in ids[:-keep_last] if i not in keep]
        for ckpt_id in victims:
            self._delete(ckpt_id)
            log.info("pruned checkpoint %s", self.url(ckpt_id))
        return victims

    def cleanup_incomplete(self, keep: Iterable[str] = ()) -> list[str]:
        """Delete checkpoint directories without a manifest (failed saves), except those in ``keep``
        (saves in progress); returns the deleted ids."""
        keep = set(keep)
        victims = [i for i in self._ids() if i not in keep and not self._has_manifest(i)]
        for ckpt_id in victims:
            self._delete(ckpt_id)
            log.info("removed incomplete checkpoint %s", self.url(ckpt_id))
        return victims

    # -- restore --------------------------------------------------------------------------------------------

    def manifest(self, ckpt_id: str) -> dict[str, Any]:
        """The manifest of a committed checkpoint; :class:`CheckpointError` listing the committed ids if none."""
        return self._manifest(ckpt_id)[0]

    def _manifest(self, ckpt_id: str) -> tuple[dict[str, Any], bytes]:
        manifest, raw = self._read_json(ckpt_id, MANIFEST)
        if manifest is None:
            ids = self.committed()
            raise CheckpointError(f"{self.url(ckpt_id)} is not a committed checkpoint (no {MANIFEST}); "
                                  f"committed: {', '.join(ids) if ids else '(none)'}")
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise CheckpointError(f"{self.url(ckpt_id, MANIFEST)} has no file list: altered")
        return manifest, raw

    def digest(self, ckpt_id: str, rel: str) -> tuple[int, str]:
        """``(bytes, sha256 hex)`` of a stored file, streamed in blocks (nothing is written locally);
        :class:`CheckpointError` when it is missing."""
        path, url = self.fs_path(ckpt_id, _check_rel(rel)), self.url(ckpt_id, rel)

        def read() -> tuple[int, str]:
            digest, size = hashlib.sha256(), 0
            try:
                with self.fs.open(path, "rb", block_size=CHUNK) as f:
                    for block in iter(lambda: f.read(CHUNK), b""):
                        digest.update(block)
                        size += len(block)
            except FileNotFoundError:
                raise CheckpointError(f"checkpoint file {url} listed in {MANIFEST} is missing") from None
            return size, digest.hexdigest()

        return self._retry(f"reading {url}", read)

    def _get_once(self, path: str, tmp: Path, url: str, size: int) -> tuple[int, str]:
        """One try at fetching ``path`` into ``tmp``; returns the size and sha256 of what arrived."""
        tmp.parent.mkdir(parents=True, exist_ok=True)
        try:
            if size <= SMALL_FILE:  # one GET into memory, hashed there: the local copy is never read back
                data = self.fs.cat_file(path)
                tmp.write_bytes(data)
                return len(data), hashlib.sha256(data).hexdigest()
            self.fs.get_file(path, str(tmp))  # streamed to disk; hashed from the page cache
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint file {url} listed in {MANIFEST} is missing") from None
        return file_digest(tmp)

    def _download_file(self, ckpt_id: str, rel: str, expected: dict[str, Any], local_dir: Path) -> None:
        target = checkpoint_file(local_dir, rel)
        tmp = target.with_name(f".{target.name}.part")
        url = self.url(ckpt_id, rel)
        path = self.fs_path(ckpt_id, rel)
        try:
            size, sha = self._retry(f"downloading {url} to {target}",
                                    lambda: self._get_once(path, tmp, url, int(expected["size"])))
        except CheckpointError:
            tmp.unlink(missing_ok=True)
            raise
        if size != expected["size"] or sha != expected["sha256"]:
            tmp.unlink(missing_ok=True)
            what = (f"{size} bytes, {MANIFEST} says {expected['size']}" if size != expected["size"]
                    else "sha256 differs")
            raise CheckpointError(f"checkpoint file {url} does not match {MANIFEST} ({what}): truncated or altered")
        os.replace(tmp, target)

    def download(self, ckpt_id: str, local_dir: str | os.PathLike,
                 select: Callable[[str], bool] | None = None) -> Path:
        """Fetch a committed checkpoint into ``local_dir`` and verify every file's size and sha256.

        ``select(rel)`` picks files (``model.json`` always comes). The store's ``MANIFEST.json`` is written
        last, byte for byte (its sha256 identifies the checkpoint), so the directory is a local checkpoint for
        :mod:`components.checkpoint.format`; after a ``select`` it lists files that were not fetched (check only
        the parts fetched). A file that does not match raises :class:`CheckpointError` naming it.
        """
        local_dir = Path(local_dir)
        manifest, raw = self._manifest(ckpt_id)
        files = {_check_rel(rel): e for rel, e in manifest["files"].items()
                 if rel == MODEL_META or select is None or select(rel)}
        local_dir.mkdir(parents=True, exist_ok=True)
        (local_dir / MANIFEST).unlink(missing_ok=True)  # a stale one must not vouch for a half-done download
        self._parallel([(rel, (lambda rel=rel, e=e: self._download_file(ckpt_id, rel, e, local_dir)))
                        for rel, e in sorted(files.items())])
        tmp = local_dir / f".{MANIFEST}.tmp"
        tmp.write_bytes(raw)
        os.replace(tmp, local_dir / MANIFEST)
        return local_dir


def _remove_quietly(path: str) -> None:
    """Remove a local file if it is there (gone already after a rename)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _open_fs(uri: str, storage_options: dict) -> tuple[Any, str]:
    import fsspec
    from fsspec.core import url_to_fs

    if not uri:
        raise CheckpointStoreError(f"empty checkpoint store URI: use {_COMMON_PROTOCOLS}")
    protocol = uri.split("://", 1)[0] if "://" in uri else "file"
    try:
        fs, root = url_to_fs(uri, **storage_options)
    except ValueError as e:
        if protocol not in fsspec.available_protocols():
            raise CheckpointStoreError(redact(f"checkpoint store {uri!r}: unknown protocol {protocol!r}; use "
                                              f"{_COMMON_PROTOCOLS}", storage_options)) from None
        raise CheckpointStoreError(redact(f"checkpoint store {uri!r}: {e}", storage_options)) from None
    except ImportError as e:
        raise CheckpointStoreError(redact(f"checkpoint store {uri!r}: protocol {protocol!r} needs a package that "
                                          f"is not installed ({e})", storage_options)) from None
    return fs, root
