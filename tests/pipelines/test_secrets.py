"""No secret is echoed or stored (issue 35, part 4), through the real entry point: a canary password in a URL of the
config is refused in one line that does not quote it, and appears in no file of the run (or sweep) directory,
no compiled pipeline and no line of the output; a credential in the environment stays out of what is compiled."""

import os
import subprocess
import sys

import pytest

from components.config import ConfigError
from components.redaction import redact, url_with_password
from tests.conftest import ROOT

CANARY = "Canary-pw-7f3e19"
URL = f"s3://ctr-user:{CANARY}@bucket/ctr"


def _cli(cwd, *args, env=None):
    return subprocess.run([sys.executable, "-m", "pipelines.ctr", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _files_holding(directory, text):
    return [str(p) for p in directory.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


@pytest.mark.parametrize("overrides", [
    ["data=criteo", f"data.uri={URL}/day_0.tsv"],
    [f"checkpoint.uri={URL}/checkpoints"],
    ["+cluster=prod", "cluster.submit=false", f"checkpoint.uri={URL}/checkpoints"],  # the compile-only path
], ids=["local data.uri", "local checkpoint.uri", "kubeflow compile"])
def test_a_url_password_is_refused_in_one_line_and_kept_nowhere(tmp_path, overrides):
    run_dir = tmp_path / "run"
    proc = _cli(tmp_path, *overrides, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr
    key = overrides[-1].split("=")[0]
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and f"'{key}' has value 's3://***@bucket/ctr" in proc.stderr
    assert CANARY not in proc.stderr + proc.stdout
    assert (run_dir / ".hydra" / "overrides.yaml").is_file()  # Hydra's record of the command line, redacted
    assert _files_holding(tmp_path, CANARY) == []
    assert not list(tmp_path.rglob("pipeline.yaml"))


def test_a_sweep_keeps_no_url_password(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = _cli(tmp_path, "-m", f"checkpoint.uri={URL}/a,{URL}/b", f"hydra.sweep.dir={sweep_dir}")
    assert (sweep_dir / "multirun.yaml").is_file()
    assert CANARY not in proc.stderr + proc.stdout
    assert _files_holding(tmp_path, CANARY) == []


def test_an_environment_credential_stays_out_of_the_compiled_pipeline(tmp_path):
    proc = _cli(tmp_path, "+cluster=prod", "cluster.submit=false", "checkpoint.uri=s3://bucket/ctr",
                f"hydra.run.dir={tmp_path / 'run'}", env={"AWS_SECRET_ACCESS_KEY": CANARY})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "pipeline.yaml").is_file() and (tmp_path / "run" / "k8s" / "ps-job.yaml").is_file()
    assert CANARY not in proc.stderr + proc.stdout
    assert _files_holding(tmp_path, CANARY) == []


def test_redact_blanks_url_user_info_and_credential_values(monkeypatch):
    monkeypatch.setenv("MY_STORE_TOKEN", CANARY)
    assert redact(f"{URL}/x failed; token {CANARY}") == "s3://***@bucket/ctr/x failed; token ***"
    assert redact("hdfs://alice@namenode/p") == "hdfs://***@namenode/p"  # a user name alone goes too
    assert redact("k=abcd", {"client_kwargs": {"secret": "abcd"}}) == "k=***"
    # A password in a config value is found wherever it sits; a user name alone is not a password.
    tree = {"data": {"uri": "hdfs://alice@nn/p"}, "export": {"uris": ["s3://b/x", URL]}}
    assert list(url_with_password(tree)) == [("export.uris[1]", URL)]


def test_a_config_error_never_holds_the_password():
    err = ConfigError("checkpoint.uri", URL, "anything", f"hint quoting {URL}")
    assert CANARY not in str(err) and CANARY not in repr(err.value)


@pytest.mark.slow
def test_a_local_run_keeps_no_credential_of_its_environment(tmp_path):
    """A whole tiny local run (data prep, a 2 + 2 PS job, evaluation, export) with credentials in its environment:
    none of them reaches a file of the run directory or a line of the output."""
    run_dir = tmp_path / "run"
    proc = _cli(tmp_path, "experiment=tiny", f"hydra.run.dir={run_dir}",
                env={"AWS_SECRET_ACCESS_KEY": CANARY, "CTR_STORE_API_TOKEN": CANARY + "-token"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run_dir / "metrics.json").is_file() and (run_dir / "config.yaml").is_file()
    assert CANARY not in proc.stderr + proc.stdout
    assert _files_holding(tmp_path, CANARY) == []
