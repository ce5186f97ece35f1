"""The storage layer's errors: which failures are worth retrying, which no wait fixes, and how a failure is
said (the errno's symbol people search for, what to set when credentials are missing)."""

from __future__ import annotations

import errno


class StorageError(Exception):
    """A store could not do what was asked (after its retries, where waiting could help)."""


class StorageRefused(StorageError):
    """The store refused for good (a full disk, no permission, no credentials): the user's to fix."""


class InvalidStoreContent(StorageError):
    """A file name that leaves the store, or a file whose content cannot be what the store wrote."""


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


TRANSIENT = _transient_types()
# OSErrors that retrying cannot fix (missing bucket/key, access denied, a directory where a file goes).
PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
# ... and by errno (plain OSErrors): a full disk or quota, a read-only filesystem; retried, they would be blamed on
# an unreachable store once a job's lease ran out.
PERMANENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
# No credentials found (botocore): an S3 store the environment holds no keys for.
NO_CREDENTIALS = _no_credentials_types()


def reason(exc: BaseException) -> str:
    message = str(exc).strip()
    if isinstance(exc, OSError) and exc.errno in errno.errorcode:  # the symbol people search for: ENOSPC, EACCES
        message = f"{message} ({errno.errorcode[exc.errno]})"
    if isinstance(exc, NO_CREDENTIALS):
        message += ": set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for this store"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
