"""Loaded at the start of every Python process of a test run whose PYTHONPATH names this directory: each typed
config build (``components.config.from_dict``) appends ``<pid> <process> <top-level keys>`` to the file
``CTR_COUNT_CONFIG_BUILDS`` names (tests/pipelines/test_config_builds.py)."""

import os
import sys

if os.environ.get("CTR_COUNT_CONFIG_BUILDS"):
    import components.config as _config

    _build = _config.from_dict

    def _counted(raw):
        keys = ",".join(sorted(raw)) if hasattr(raw, "keys") else type(raw).__name__
        with open(os.environ["CTR_COUNT_CONFIG_BUILDS"], "a") as record:
            record.write(f"{os.getpid()} {' '.join(sys.argv[:3])[-80:]!r} {keys}\n")
        return _build(raw)

    _config.from_dict = _counted
