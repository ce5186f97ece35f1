"""Each process of a local run builds the typed config once (components.config.from_dict), counted in every process
by tests/pipelines/config_builds/sitecustomize.py."""

import collections
import os
import subprocess
import sys

from tests.conftest import ROOT

COUNTER_DIR = ROOT / "tests" / "pipelines" / "config_builds"


def test_every_process_of_a_local_run_builds_the_config_at_most_once(tmp_path):
    record = tmp_path / "builds.txt"
    env = {**os.environ, "PYTHONPATH": f"{COUNTER_DIR}{os.pathsep}{ROOT}", "CTR_COUNT_CONFIG_BUILDS": str(record),
           "CI": "true"}
    done = subprocess.run([sys.executable, "-m", "pipelines.ctr", "experiment=tiny", "ps.epochs=1",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    builds = collections.Counter(line.split(" ", 1)[0] for line in record.read_text().splitlines())
    lines = record.read_text()
    assert len(builds) >= 8, lines  # the driver, the steps, the servers and the workers each built one
    assert max(builds.values()) == 1, lines
