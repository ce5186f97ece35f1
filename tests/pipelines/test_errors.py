"""Every error a user can cause ends as one line on stderr with exit status 2, through the real entry point.

Each case fails before any training starts (the data case inside a step fails in data prep); the failed
Kubeflow submission (exit status 3) is tests/pipelines/test_kubeflow.py's test_cli_reports_an_unreachable_host_in_one_line.
"""

import os
import subprocess
import sys

import pytest

from pipelines.errors import ExitStatus, user_error
from pipelines.local import PipelineRunError
from tests.conftest import ROOT


def _cli(tmp_path, *overrides, env=None):
    return subprocess.run([sys.executable, "-m", "pipelines.ctr", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _binary_file(tmp_path):
    path = tmp_path / "day_0.tsv"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    return path


def _malformed_tsv(tmp_path):
    path = tmp_path / "day_0.tsv"
    path.write_text("hello\tworld\n" * 50)
    return path


CASES = {
    # class: (overrides, what the line must say)
    "override of an unknown option (Hydra)": (lambda tmp: ["model=nosuch"],
                                              ["Could not find 'model/nosuch'", "dcn, deepfm, dnn, wide_deep"]),
    "override of the wrong type (Hydra)": (lambda tmp: ["ps.servers=two"], ["ps.servers=two", "Integer"]),
    "config value": (lambda tmp: ["ps.batch_size=0"], ["'ps.batch_size' has value 0", "a number > 0"]),
    "data: a binary file": (lambda tmp: ["data=criteo", f"data.uri={_binary_file(tmp)}"],
                            ["'data.uri'", "is binary", "data.format=raw"]),
    "data: no file": (lambda tmp: ["data=criteo", f"data.uri={tmp}/missing-*.tsv"], ["'data.uri'", "nothing matches"]),
    "data: malformed lines, found by data prep": (
        lambda tmp: ["experiment=tiny", "data=criteo", f"data.uri={_malformed_tsv(tmp)}"],
        ["step merge-data: 50 of 50 lines", "malformed", "max_malformed_fraction"]),
    "checkpoint store": (lambda tmp: [f"checkpoint.uri={tmp / 'file'}/checkpoint"],
                         ["'checkpoint.uri'", "a store this machine can write"]),
    "cluster": (lambda tmp: ["+cluster=prod", "checkpoint.uri=s3://bucket/ctr"],
                ["'cluster.host'", "cluster.submit=false"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_error_is_one_line_with_status_2(tmp_path, case):
    (tmp_path / "file").write_text("a file where the store's directory would be")
    overrides, expected = CASES[case]
    proc = _cli(tmp_path, *overrides(tmp_path))
    assert proc.returncode == ExitStatus.USER_ERROR, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: ")
    for part in expected:
        assert part in line
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "run" / "logs").exists()  # no PS job started


def test_hydra_full_error_shows_the_traceback(tmp_path):
    proc = _cli(tmp_path, "ps.batch_size=0", env={"HYDRA_FULL_ERROR": "1"})
    assert proc.returncode == 1
    assert "Traceback (most recent call last):" in proc.stderr
    assert "ConfigError: config key 'ps.batch_size' has value 0" in proc.stderr


def test_internal_errors_are_not_user_errors():
    assert user_error(RuntimeError("a bug")) is None
    failed = "Pipeline 'p' finished with status FAILURE. Inner task failed: 'train'."
    assert user_error(PipelineRunError(failed, "ValueError: a bug in a step")) is None
    assert user_error(PipelineRunError(failed, "components.train.job.PsJobError: worker-0 exited")) is None
    status, line = user_error(PipelineRunError(failed, "components.data_prep.sources.DataPrepError: no rows\nin x"))
    assert (status, line) == (ExitStatus.USER_ERROR, "step train: no rows | in x")
