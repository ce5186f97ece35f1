"""The README's Python API example, run as the README has it (the block is read from the file)."""

import re

from components.checkpoint.store import CheckpointStore
from tests.conftest import ROOT


def test_the_readmes_python_example_runs_and_gets_the_runs_metrics(tmp_path, capsys):
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    (example,) = [code for code in blocks if "from pipelines.ctr import run" in code]
    assert "/tmp/ctr-run" in example
    namespace: dict = {}
    exec(compile(example.replace("/tmp/ctr-run", str(tmp_path / "run")), "README.md", "exec"), namespace)
    result = namespace["result"]
    metrics, run_dir = result.metrics, tmp_path / "run"
    assert 0.5 < result.test_auc == metrics["auc"] < 1
    assert metrics["lift_auc"] == metrics["auc"] - metrics["baseline_auc"]
    assert result.report == run_dir / "report.html" and result.report.is_file()
    assert result.checkpoint in CheckpointStore(str(run_dir / "checkpoint")).committed()
    printed = capsys.readouterr().out.splitlines()[-1].split()
    assert printed == [str(metrics["auc"]), str(metrics["lift_auc"]), str(result.report), result.checkpoint]
