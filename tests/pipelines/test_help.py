"""``python -m pipelines.ctr --help`` lists what conf/ holds: every group, every option with its description."""

import os
import re
import subprocess
import sys

from tests.conftest import CONF, ROOT


def _help(*overrides: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "pipelines.ctr", "--help", *overrides], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _first_comment(path) -> str:
    return next(line.lstrip("#").strip() for line in path.read_text().splitlines()
                if line.startswith("#") and not line.startswith("# @package"))


def test_help_lists_every_group_and_option_of_conf():
    text = _help()
    lines = text.splitlines()
    groups = sorted(d for d in CONF.iterdir() if d.is_dir() and any(d.glob("*.yaml")))
    assert len(groups) >= 8
    for group in groups:
        assert any(re.match(rf"^  {group.name} \(", line) for line in lines), group.name
        for option in group.glob("*.yaml"):
            [line] = [line for line in lines if re.match(rf"^    {option.stem}  ", line)
                      and line.split()[0] == option.stem and group.name in _owner(lines, line)]
            # The option file's own words: the start of its first comment line.
            assert _first_comment(option)[:40].rstrip(":") in line, (option, line)
    assert "ps.servers" in text and "checkpoint.uri" in text and "plan" in text
    assert text.count("python -m pipelines.ctr ") >= 3  # the usage line and the examples


def _owner(lines, option_line) -> str:
    """The group heading above an option line."""
    above = lines[:lines.index(option_line)]
    return next(line for line in reversed(above) if re.match(r"^  \w+ \(", line))


def test_help_shows_the_values_the_overrides_compose():
    assert re.search(r"^  ps\.servers .*\[2\]$", _help(), re.M)
    assert re.search(r"^  ps\.servers .*\[1\]$", _help("experiment=tiny"), re.M)
