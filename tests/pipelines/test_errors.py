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
from tests.conftest import ROOT, committed_checkpoints, job_processes


def _cli(tmp_path, *overrides, env=None):
    return subprocess.run([sys.executable, "-m", "pipelines.ctr", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _binary_file(tmp_path):
    path = tmp_path / "day_0.tsv"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    return path


def _corrupt_checkpoint(tmp_path):
    """A store whose one checkpoint has a changed byte in a file: ``(store path, checkpoint id)``."""
    (committed,) = committed_checkpoints(tmp_path, 1)
    table = committed / "tables" / "part-000"
    table.write_bytes(b"\x01" + table.read_bytes()[1:])
    return committed.parent, committed.name


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
    "TLS where the backend cannot carry it": (lambda tmp: ["ps.tls=on"],
                                              ["'ps.tls' has value 'on'", "auto or off for this backend", "loopback"]),
    "data: a binary file": (lambda tmp: ["data=criteo", f"data.uri={_binary_file(tmp)}"],
                            ["'data.uri'", "is binary", "data.format=raw"]),
    "data: no file": (lambda tmp: ["data=criteo", f"data.uri={tmp}/missing-*.tsv"], ["'data.uri'", "nothing matches"]),
    "data: malformed lines, found by data prep": (
        lambda tmp: ["experiment=tiny", "data=criteo", f"data.uri={_malformed_tsv(tmp)}"],
        ["step merge-data: 50 of 50 lines", "malformed", "max_malformed_fraction"]),
    "checkpoint store": (lambda tmp: [f"checkpoint.uri={tmp / 'file'}/checkpoint"],
                         ["'checkpoint.uri'", "a store this machine can write"]),
    "a corrupt checkpoint named explicitly": (
        lambda tmp: (lambda store, ckpt: [f"checkpoint.uri={store}", f"checkpoint.resume={ckpt}"])(
            *_corrupt_checkpoint(tmp)),
        ["'checkpoint.resume'", "is corrupt (tables/part-000 does not match its sha256 in MANIFEST.json"]),
    "no intact checkpoint to resume": (
        lambda tmp: [f"checkpoint.uri={_corrupt_checkpoint(tmp)[0]}", "checkpoint.resume=latest"],
        ["'checkpoint.resume'", "is corrupt", "no committed checkpoint there is intact"]),
    "ps.host not on this machine": (lambda tmp: ["ps.host=192.0.2.1"],  # TEST-NET-1: no machine's own
                                    ["'ps.host' has value '192.0.2.1'", "cannot listen on it"]),
    "a GPU asked of this machine's CPU build of Paddle": (
        lambda tmp: ["cluster.workers.gpus=1"], ["'cluster.workers.gpus' has value 1", "a CPU build"]),
    "a network of the user's that does not import": (
        lambda tmp: ["model=custom", "model.network=no_such_package.nets:network"],
        ["'model.network' has value 'no_such_package.nets:network'", "cannot import 'no_such_package.nets'"]),
    "dense adagrad outside geo": (lambda tmp: ["model.optimizer=adagrad"],
                                  ["'model.optimizer' has value 'adagrad'", "only with ps.mode=geo"]),
    "ps.host on every interface": (lambda tmp: ["ps.host=0.0.0.0"],
                                   ["'ps.host' has value '0.0.0.0'", "a loopback address", "allow_external_bind"]),
    "a compression Paddle's brpc lacks": (lambda tmp: ["ps.compress=lz4"],
                                          ["'ps.compress' has value 'lz4'", "none, snappy, gzip or zlib"]),
    "a compression no one has": (lambda tmp: ["ps.compress=brotli"],
                                 ["ps.compress=brotli", "none, snappy, gzip, zlib, lz4"]),
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


def test_a_ps_job_whose_role_kept_failing_is_one_line_naming_the_role_the_attempts_and_its_log():
    failed = "Pipeline 'p' finished with status FAILURE. Inner task failed: 'train'."
    step_error = ("components.train.backends.local.RoleFailed: PS job abc: worker-0 exited with code -9 (killed by "
                  "SIGKILL) on attempt 3 of 3 (cluster.max_restarts=2); its log: /r/logs/worker-0.log\nLast lines:\n"
                  "    I1204 fleet init done")
    assert user_error(PipelineRunError(failed, step_error)) == (
        ExitStatus.JOB_FAILED, "step train: PS job abc: worker-0 exited with code -9 (killed by SIGKILL) on attempt 3 "
                               "of 3 (cluster.max_restarts=2); its log: /r/logs/worker-0.log")


def test_an_s3_store_without_credentials_is_one_line(tmp_path):
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    # Nothing to find anywhere, and nothing may leave loopback even if botocore tried.
    env.update(AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null", AWS_EC2_METADATA_DISABLED="true",
               AWS_ENDPOINT_URL="http://127.0.0.1:9", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "pipelines.ctr", "experiment=tiny",
                           "checkpoint.uri=s3://ckpt-bucket/run", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == ExitStatus.USER_ERROR, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: config key 'checkpoint.uri' has value 's3://ckpt-bucket/run'")
    assert "s3://ckpt-bucket/run/_probe-" in line and "NoCredentialsError" in line and "AWS_ACCESS_KEY_ID" in line


def _tmpfs(path, options):
    """A tmpfs mounted at ``path`` (root only; the test is skipped elsewhere), unmounted afterwards."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture
def full_disk(tmp_path):
    """1 MiB: room for the store's probe and lease, not for a checkpoint."""
    yield from _tmpfs(tmp_path / "disk", "size=1m")


@pytest.fixture
def read_only_disk(tmp_path):
    yield from _tmpfs(tmp_path / "ro", "size=1m,ro")


def test_a_store_that_refuses_writes_is_one_line_naming_the_cause_and_the_file(tmp_path, read_only_disk):
    proc = _cli(tmp_path, "experiment=tiny", f"checkpoint.uri={read_only_disk / 'ckpt'}")
    assert proc.returncode == ExitStatus.USER_ERROR, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: config key 'checkpoint.uri' has value '{read_only_disk / 'ckpt'}'")
    assert "Read-only file system" in line and "(EROFS)" in line
    assert not (tmp_path / "run" / "kfp").exists()  # before data prep


def test_a_full_disk_under_the_store_is_one_line_naming_enospc_with_nothing_half_written(tmp_path, full_disk):
    proc = _cli(tmp_path, "experiment=tiny", f"checkpoint.uri={full_disk / 'ckpt'}")
    assert proc.returncode == ExitStatus.USER_ERROR, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: step train: ") and "No space left on device (ENOSPC)" in line
    assert f"file://{full_disk / 'ckpt'}/" in line
    assert "Traceback" not in proc.stdout + proc.stderr
    assert sorted(p.name for p in full_disk.rglob("*.tmp-*")) == []
    assert not (full_disk / "ckpt" / "LATEST").exists()  # the partial checkpoint is nobody's latest
    assert not list(full_disk.glob("ckpt/*/MANIFEST.json"))
    assert job_processes(str(tmp_path)) == []


def test_a_step_failing_on_a_corrupt_checkpoint_file_is_one_line_naming_it():
    failed = "Pipeline 'p' finished with status FAILURE. Inner task failed: 'evaluate-model'."
    step_error = ("components.checkpoint.format.CheckpointError: checkpoint file file:///s/c/scores/test.npz does not "
                  "match MANIFEST.json (sha256 differs): truncated or altered")
    assert user_error(PipelineRunError(failed, step_error)) == (
        ExitStatus.USER_ERROR, "step evaluate-model: checkpoint file file:///s/c/scores/test.npz does not match "
                               "MANIFEST.json (sha256 differs): truncated or altered")
