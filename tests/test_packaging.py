"""The package declares what it imports and installs its console scripts."""

from __future__ import annotations

import ast
import importlib.util
import os
import importlib.metadata as metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OWN_PACKAGES = ("components", "pipelines", "conf")


def _imported_top_level_modules() -> set[str]:
    modules: set[str] = set()
    for package in OWN_PACKAGES:
        for source in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text(), str(source))):
                if isinstance(node, ast.Import):
                    modules.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - set(OWN_PACKAGES)


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_every_imported_package_is_a_declared_dependency():
    declared = {_requirement_name(r) for r in _project()["dependencies"]}
    distributions = metadata.packages_distributions()
    undeclared = {}
    for module in sorted(_imported_top_level_modules()):
        providers = {d.lower().replace("_", "-") for d in distributions.get(module, [])}
        assert providers, f"{module} is imported but no installed distribution provides it"
        if not providers & declared:
            undeclared[module] = sorted(providers)
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


def test_console_scripts_point_at_the_module_entries():
    assert _project()["scripts"] == {"ctr": "pipelines.ctr:cli", "ctr-serving": "components.export.serving:cli"}
    for name, target in _project()["scripts"].items():
        module, function = target.split(":")
        code = f"import {module}; assert callable({module}.{function})"
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_ctr_serving_script_answers_help():
    # The script's main is the module's: its usage names every subcommand.
    out = subprocess.run([sys.executable, "-c", "from components.export.serving import cli; cli()", "--help"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert all(command in out.stdout for command in ("export", "predict", "serve"))


def test_each_store_extra_brings_the_package_fsspec_opens_its_protocol_with():
    from fsspec.registry import known_implementations

    from components.storage import STORE_EXTRAS
    extras = _project()["optional-dependencies"]
    for protocol, extra in STORE_EXTRAS.items():
        package = known_implementations[protocol]["class"].split(".")[0]
        assert package in {_requirement_name(r) for r in extras[extra]}, (protocol, extra, extras[extra])


@pytest.mark.parametrize("uri, package, extra", [("gs://bucket/ctr", "gcsfs", "gcs"),
                                                  ("az://container/ctr", "adlfs", "azure")])
def test_a_store_whose_package_is_missing_names_the_extra_to_install(uri, package, extra):
    from components.storage import Storage
    if importlib.util.find_spec(package):
        pytest.skip(f"{package} is installed")
    with pytest.raises(Storage.Error, match=re.escape(f"pip install 'paddle-ps-pipelines[{extra}]'")):
        Storage(uri)._open_fs()


def test_ctr_script_takes_hydra_overrides(tmp_path):
    # As the installed script calls it: argv[0] is the script's name, the overrides follow; plan=true starts nothing.
    code = "import sys; sys.argv[0] = 'ctr'; from pipelines.ctr import cli; cli()"
    out = subprocess.run([sys.executable, "-c", code, "plan=true", "model=deepfm", "model.learning_rate=0.01"],
                         capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "model       deepfm" in out.stdout
    assert not list(tmp_path.iterdir())



def test_the_brpc_tls_library_source_is_package_data():
    """A built package carries brpc_tls.cc beside brpc_tls.py, which builds the library from it off the image."""
    from components.ps import brpc_tls

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert brpc_tls.SOURCE.name in package_data["components.ps"] and brpc_tls.SOURCE.is_file()
