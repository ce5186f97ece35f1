"""File names that a manifest (a store's ``serving.json``, a checkpoint's ``MANIFEST.json``) gives, kept inside
their root.

A manifest is written by whoever can write the store, so a name in it is data, not a path to trust: ``../..``,
an absolute path or a symlink would make a reader write or read outside the directory it meant to. Both stores
check every name with these two functions, on read and on write. It imports nothing of the project, so any room
can use it.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath


class UnsafePathError(ValueError):
    """A file name that would leave the directory it is meant to be in."""


def check_rel(rel: str, what: str) -> str:
    """``rel`` normalised to a posix path relative to its root (no ``..``, ``.`` or empty part, not absolute,
    no drive); ``what`` names where it comes from, for the one-line error."""
    text = str(rel).replace("\\", "/")
    parts = PurePosixPath(text).parts
    if (not text.strip("/") or text.startswith("/") or ":" in (parts[0] if parts else "")
            or any(p in ("", ".", "..") for p in text.strip("/").split("/"))):
        raise UnsafePathError(f"bad file name {str(rel)!r} in {what}: it must be a relative path inside its "
                              "directory, without '..' (the manifest is altered or was not written by this code)")
    return "/".join(PurePosixPath(text.strip("/")).parts)


def inside(root: str | os.PathLike, rel: str, what: str) -> Path:
    """``root/rel`` resolved (symlinks followed), refused unless it stays inside ``root`` resolved: a symlink
    in the store that points out of it is as dangerous as ``..``."""
    base = Path(root).resolve()
    path = (base / check_rel(rel, what)).resolve()
    if path != base and base not in path.parents:
        raise UnsafePathError(f"file {str(rel)!r} in {what} leads to {path}, outside {base} (a symlink out of "
                              "the directory): refusing it")
    return path
