"""Each process of a local run builds the typed config once (components.config.from_dict), counted in every process
by tests/pipelines/config_builds/sitecustomize.py."""

import collections
import os
import re
import subprocess
import sys

from tests.conftest import ROOT

COUNTER_DIR = ROOT / "tests" / "pipelines" / "config_builds"


def test_every_process_of_a_local_run_builds_the_config_at_most_once(tmp_path):
    record = tmp_path / "builds.txt"
    env = {**os.environ, "PYTHONPATH": f"{COUNTER_DIR}{os.pathsep}{ROOT}", "CTR_COUNT_CONFIG_BUILDS": str(record),
           "CI": "true"}
    done = subprocess.run([sys.executable, "-m", "pipelines.ctr", "experiment=tiny", "ps.epochs=1", "ps.servers=2",
                           "ps.workers=2", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = record.read_text()
    builds = collections.Counter(line.split(" ", 1)[0] for line in lines.splitlines())
    assert max(builds.values()) == 1, lines
    # Every kind of process was counted: the driver, the steps (kfp.local's executor) and each PS role (a role
    # used to build it twice), so a process the counter missed cannot pass for one that built once.
    assert lines.count("pipelines/ctr.py") == 1, lines
    assert lines.count("ephemeral_component.py") >= 5, lines
    roles = sorted(re.findall(r"/work/(\w+-\d)/job\.json", lines))
    assert roles == ["server-0", "server-1", "worker-0", "worker-1"], lines
