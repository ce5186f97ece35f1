"""The README's Python API example, run as the README has it (the block is read from the file)."""

import re

from tests.conftest import ROOT


def test_the_readmes_python_example_runs_and_gets_the_runs_metrics(tmp_path, capsys):
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    (example,) = [code for code in blocks if "from pipelines.ctr import run" in code]
    assert "/tmp/ctr-run" in example
    namespace: dict = {}
    exec(compile(example.replace("/tmp/ctr-run", str(tmp_path / "run")), "README.md", "exec"), namespace)
    metrics = namespace["metrics"]
    assert 0.5 < metrics["auc"] < 1 and metrics["lift_auc"] == metrics["auc"] - metrics["baseline_auc"]
    printed = capsys.readouterr().out.splitlines()[-1].split()
    assert [float(value) for value in printed] == [metrics["auc"], metrics["baseline_auc"], metrics["lift_auc"]]
