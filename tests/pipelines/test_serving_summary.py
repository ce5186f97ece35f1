"""What a local run's summary tells after an export: the exact command that serves it, and a request to try."""

import shlex

from pipelines.local import serving_rows


def test_a_sharded_export_is_served_from_its_store(config, tmp_path):
    rows = dict(serving_rows(config("export.uri=/models/ctr", "cluster.serving.name=ads"), tmp_path))
    assert shlex.split(rows["serve it"]) == ["python", "-m", "components.export.serving", "serve", "--model",
                                             "/models/ctr", "--host", "127.0.0.1", "--port", "8080", "--name", "ads"]
    assert rows["then try"].endswith(" http://127.0.0.1:8080/v1/models/ads:predict")


def test_a_single_file_export_is_served_from_the_run_directory(config, tmp_path):
    run_dir = tmp_path / "run dir"  # a space: the command quotes it
    rows = dict(serving_rows(config("export.format=single"), run_dir))
    assert shlex.split(rows["serve it"])[5] == str(run_dir / "serving_model")
