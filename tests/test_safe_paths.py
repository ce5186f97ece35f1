"""components/safe_paths.py: a manifest's file name normalised, or refused in one line when it would leave its
root."""

from __future__ import annotations

import pytest

from components.safe_paths import UnsafePathError, check_rel, inside


@pytest.mark.parametrize("rel, normalised", [("a/b.npy", "a/b.npy"), ("shards/00001.ids.npy/", "shards/00001.ids.npy"),
                                             ("a\\b", "a/b")])
def test_relative_names_are_normalised(rel, normalised):
    assert check_rel(rel, "a test manifest") == normalised


@pytest.mark.parametrize("rel", ["", "/", "..", "../x", "a/../../x", "/etc/passwd", "a/./b", "a//b", "C:/x",
                                 "..\\x"])
def test_names_that_could_leave_the_root_are_refused_in_one_line(rel):
    with pytest.raises(UnsafePathError) as refused:
        check_rel(rel, "serving.json of s3://b/v000001")
    message = str(refused.value)
    assert "\n" not in message and repr(rel) in message and "serving.json of s3://b/v000001" in message


def test_inside_follows_symlinks_and_refuses_one_leaving_the_root(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "in").symlink_to(root / "sub")
    (root / "out").symlink_to(outside)
    assert inside(root, "in/x.npy", "t") == (root / "sub" / "x.npy").resolve()
    assert inside(root, "not/yet/there.npy", "t") == root.resolve() / "not/yet/there.npy"
    with pytest.raises(UnsafePathError, match="outside"):
        inside(root, "out/x.npy", "t")
