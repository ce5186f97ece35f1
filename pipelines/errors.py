"""Which errors are the user's to fix, and how the command reports them: one line on stderr and an exit status.

A user error (a config value, the input data, the checkpoint store or a checkpoint in it, the cluster, an override
Hydra cannot compose) is reported as ``error: <message>`` in one line, with :attr:`ExitStatus.USER_ERROR`, or
:attr:`ExitStatus.SUBMIT_ERROR` for a Kubeflow submission (or awaited run) that failed. Any other exception is
an internal error and keeps its traceback; ``HYDRA_FULL_ERROR=1`` shows the traceback of user errors too.

A step of a local run fails in its own process: :class:`pipelines.local.PipelineRunError` quotes the step's
exception (``module.Class: message``), which :func:`user_error` recognises by importing that class.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Optional

from components.redaction import redact

if TYPE_CHECKING:
    from pipelines.local import PipelineRunError

FULL_ERROR_ENV = "HYDRA_FULL_ERROR"
# Whether the user asked for tracebacks (Hydra's own test: exactly "1"), read before :func:`run_main` sets it.
TRACEBACKS_ASKED = os.environ.get(FULL_ERROR_ENV) == "1"
# The exception line a step's traceback ends with: ``components.data_prep.sources.DataPrepError: message``.
_EXCEPTION_LINE = re.compile(r"^(?P<module>components(?:\.\w+)+)\.(?P<name>\w+): (?P<message>.*)$")


class ExitStatus(enum.IntEnum):
    USER_ERROR = 2
    SUBMIT_ERROR = 3
    # A role of the PS job kept failing through its whole-job restarts (cluster.max_restarts), or failed in a way no
    # restart mends: one line naming the role, the attempts and its log.
    JOB_FAILED = 4


def _user_error_classes() -> dict[type, ExitStatus]:
    from hydra.errors import CompactHydraException

    from components.checkpoint.format import CheckpointError
    from components.config import ConfigError
    from components.data_prep.sources import DataPrepError
    from components.train.job import RoleFailed
    from pipelines.kubeflow import SubmitError

    return {ConfigError: ExitStatus.USER_ERROR, DataPrepError: ExitStatus.USER_ERROR,
            CheckpointError: ExitStatus.USER_ERROR, CompactHydraException: ExitStatus.USER_ERROR,
            SubmitError: ExitStatus.SUBMIT_ERROR, RoleFailed: ExitStatus.JOB_FAILED}


def _status_of(error_class: type) -> Optional[ExitStatus]:
    return next((status for cls, status in _user_error_classes().items() if issubclass(error_class, cls)), None)


def user_error(err: BaseException) -> Optional[tuple[ExitStatus, str]]:
    """``(exit status, one-line message)`` when ``err`` is the user's to fix; None for an internal error."""
    from pipelines.local import PipelineRunError

    if isinstance(err, PipelineRunError):
        return _failed_step(err)
    status = _status_of(type(err))
    if status is None:
        return None
    return status, _hydra_message(err) if _is_hydra_error(err) else _one_line(str(err))


def _failed_step(err: "PipelineRunError") -> Optional[tuple[ExitStatus, str]]:
    """A step that died of a user error: the class its traceback names, imported, decides."""
    first = err.step_error.strip().splitlines()[:1]
    found = _EXCEPTION_LINE.match(first[0]) if first else None
    if not found:
        return None
    try:
        error_class = getattr(importlib.import_module(found["module"]), found["name"])
    except (ImportError, AttributeError):
        return None
    status = _status_of(error_class) if isinstance(error_class, type) else None
    if status is None:
        return None
    # A failed role's first line says it all; the log lines after it are in its log, which that line names.
    further = [] if status is ExitStatus.JOB_FAILED else err.step_error.strip().splitlines()[1:]
    return status, f"step {err.step}: {_one_line(chr(10).join([found['message'], *further]))}"


def _is_hydra_error(err: BaseException) -> bool:
    from hydra.errors import CompactHydraException

    return isinstance(err, CompactHydraException)


def _hydra_message(err: BaseException) -> str:
    """Hydra's composition errors in one line: the message, a listing as a comma-separated list, the cause's
    first line (an OmegaConf error's further lines repeat the key); the config search path is left out."""
    parts: list[str] = []
    for line in str(err).splitlines():
        if line.startswith("Config search path:"):
            break
        if line.startswith("\t") and parts:
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line.strip()
        elif line.strip():
            parts.append(line.strip().rstrip("."))
    if err.__cause__ is not None:
        parts.append(str(err.__cause__).splitlines()[0])
    return _one_line("; ".join(parts)) + " (python -m pipelines.ctr --help lists the groups and keys)"


def _one_line(message: str) -> str:
    return " | ".join(line.strip() for line in message.splitlines() if line.strip())


@contextlib.contextmanager
def reported_in_one_line() -> Iterator[None]:
    """Turn a user error raised inside into ``error: ...`` on stderr and its exit status; let others through."""
    try:
        yield
    except Exception as err:
        found = None if TRACEBACKS_ASKED else user_error(err)
        if found is None:
            raise
        status, message = found
        print(f"error: {redact(message)}", file=sys.stderr, flush=True)
        raise SystemExit(status) from None


def run_main(main: Callable[[], Any]) -> None:
    """Run a ``@hydra.main`` function with Hydra's composition errors reported like every user error.

    Hydra prints those itself (and exits 1) unless ``HYDRA_FULL_ERROR=1``; set, it raises them to the caller.
    """
    os.environ[FULL_ERROR_ENV] = "1"
    with reported_in_one_line():
        main()
