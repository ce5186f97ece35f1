"""What Hydra writes and logs of a run before this code sees its config, redacted (:mod:`components.redaction`).

Hydra keeps the composed config and the command line's overrides in ``.hydra/`` of the run directory (a sweep's in
``multirun.yaml``) and logs a sweep's overrides, before the run starts: a ``user:password@`` given on the command
line would stay there although :func:`components.config_rules.validate` refuses it a moment later. This callback
(``conf/config.yaml``, ``hydra.callbacks``, listed first) rewrites those files without it and redacts every log
record made from then on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from components.redaction import redact, redact_files


def redact_log_records() -> None:
    """Every log record made from now on carries its message redacted. At the records' making, not on handlers:
    Hydra configures its logging anew for each sweep launch and job, replacing the handlers."""
    make = logging.getLogRecordFactory()
    if getattr(make, "redacting", False):
        return

    def redacted_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return record

    redacted_record.redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(redacted_record)


class RedactedRecords(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        redact_log_records()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        redact_log_records()  # before the launcher logs each job's overrides

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra = HydraConfig.get()
        records = list((Path(hydra.runtime.output_dir) / hydra.output_subdir).glob("*.yaml")
                       if hydra.output_subdir is not None else [])
        if hydra.mode is RunMode.MULTIRUN:
            records.append(Path(hydra.sweep.dir) / "multirun.yaml")
        redact_files(records)
