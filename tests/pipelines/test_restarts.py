"""The local driver as a user runs it, with a worker killed mid-pass: the run restarts the PS job by itself and ends
as an undisturbed run of the same seed does. (The launcher's restarts in detail, faster: tests/ps/test_restarts.py.)
"""

import json
import os
import signal

import pytest

from tests.conftest import job_processes
from tests.pipelines.test_lifecycle import Driver

# Default settings but for the rows: enough for a pass of ~10 s, in which a worker can be killed halfway.
RUN = ("experiment=tiny", "data.rows=200000")


def _worker_0(run_dir):
    (pid,) = [int(line.split()[0]) for line in job_processes(str(run_dir))
              if "components.ps.role" in line and "/worker-0/job.json" in line]
    return pid


def _test_auc(run_dir):
    return json.loads((run_dir / "metrics.json").read_text())["auc"]


@pytest.mark.slow  # two whole runs of ~80 s; fast twin: tests/ps/test_restarts.py (the launcher on its own)
def test_a_worker_killed_mid_pass_ends_the_run_with_exit_0_and_the_auc_of_an_undisturbed_run(tmp_path):
    undisturbed = Driver(tmp_path / "undisturbed", *RUN)
    assert undisturbed.popen.wait(300) == 0, "".join(undisturbed.lines[-30:])

    run_dir = tmp_path / "killed"
    driver = Driver(run_dir, *RUN)
    driver.wait_for("  epoch 2: ")  # the console's progress line inside pass 2
    os.kill(_worker_0(run_dir), signal.SIGKILL)
    assert driver.popen.wait(300) == 0, "".join(driver.lines[-30:])
    restarts = [line.strip() for line in driver.lines if line.strip().startswith("restart ")]
    assert len(restarts) == 1 and "worker-0 exited with code -9 (killed by SIGKILL); attempt 2 of 3 resuming from " \
                                   "checkpoint " in restarts[0], driver.lines
    assert abs(_test_auc(run_dir) - _test_auc(tmp_path / "undisturbed")) < 0.01
    assert "examples_trained_twice" in (run_dir / "report.md").read_text()
    assert not job_processes(str(tmp_path))
