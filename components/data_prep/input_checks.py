"""The run's inputs checked before anything expensive starts, through data prep's own lister
(:func:`components.data_prep.sources.list_inputs`: the files data prep will read, hidden ones skipped): each input
(each day's) exists, holds bytes and is text, and a weight column is where the config says. Each failure is one
:class:`~components.config.ConfigError` naming the key."""

from __future__ import annotations

import math
from typing import Optional

import fsspec
from fsspec.utils import infer_compression

from components.config import ConfigError, CtrConfig, DataConfig, DataSource, FileFormat
from components.config_rules import RAW_FIELDS
from components.data_prep.sources import NoInputFiles, list_inputs
from components.days import day_uri, expand_days, is_daily


def check_inputs(cfg: CtrConfig) -> None:
    """Every input the run reads (none for synthetic data); a driver submitting to Kubeflow may hold no credentials
    for the cluster's storage, so there the run's first step calls this, with the cluster's."""
    if cfg.data.source is DataSource.synthetic:
        return
    for uri, day in _uris_to_check(cfg):
        _check_data_uri(cfg.data, uri, day)


# How much of the first input file is read to tell text from binary (an image, a Parquet file, a model).
SNIFF_BYTES = 4096


def _uris_to_check(cfg: CtrConfig) -> list[tuple[Optional[str], Optional[str]]]:
    """``(uri, day)`` of every input a run reads: each of its days' (None: the one ``data.uri``); none for a
    recurring run, whose day is known when it runs (its first step checks it)."""
    data = cfg.data
    if not is_daily(data.uri):
        return [(data.uri, None)]
    days = [str(data.day)] if data.day is not None else expand_days(data.days or [])
    return [(day_uri(data.uri, day), day) for day in days]  # type: ignore[arg-type]


def _check_data_uri(data: DataConfig, uri: Optional[str], day: Optional[str] = None) -> None:
    """The input exists, holds bytes, and is text; ``day``: the day whose input ``uri`` is (errors name it)."""
    key, of_day = ("data.days", f"day {day!r}: ") if day is not None else ("data.uri", "")
    if not uri:
        raise ConfigError("data.uri", uri, "a path, glob or fsspec URL of the input files",
                          "set data.uri=... when data=criteo")
    try:
        files = list_inputs(uri)
    except NoInputFiles:
        raise ConfigError(key, uri, "an existing path, glob or fsspec URL", f"{of_day}nothing matches it") from None
    except Exception as err:  # an unknown protocol, an unreachable store
        cause = err.__cause__ or err
        raise ConfigError(key, uri, "an existing path, glob or fsspec URL", f"{of_day}cannot list it: {cause}") from None
    first = next((f.url for f in files if f.size), None)
    if first is None:
        raise ConfigError(key, uri, "input files holding rows", f"{of_day}every file it names is empty"
                          + (" (a day whose logs did not arrive?)" if day is not None else ""))
    with fsspec.open(first, "rb", compression=infer_compression(first)) as head:
        sniffed = head.read(SNIFF_BYTES)
    if b"\0" in sniffed:  # every data.format is text: a NUL byte means another kind of file
        raise ConfigError(key, uri, f"text files in data.format={data.format.value}",
                          f"{of_day}{first} is binary (a NUL byte in its first {SNIFF_BYTES} bytes); point data.uri "
                          "at the TSV or text files (compressed ones may end in .gz, .bz2, ...)")
    if data.weight_column is not None:
        _check_sampled_weights(data, first, sniffed, of_day)


def _check_sampled_weights(data: DataConfig, path: str, head: bytes, of_day: str) -> None:
    """Every whole line of ``head`` (the first bytes of the first input file) that holds Criteo's fields (raw) or
    any token has a weight where data.weight_column says, a finite number >= 0: a wrong column fails here, before
    data prep reads the input."""
    column = data.weight_column
    lines = head.split(b"\n")
    for number, raw in enumerate(lines[:-1] if len(head) == SNIFF_BYTES else lines, 1):  # the last may be cut
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if data.format is FileFormat.raw:
            fields = line.split("\t")
            if len(fields) < RAW_FIELDS:  # a malformed line: data prep counts it
                continue
            found = fields[int(column):int(column) + 1]
        else:
            if not line.split():
                continue
            found = [token.partition(":")[2] for token in line.split() if token.startswith(f"{column}:")]
        problem = _weight_problem(found)
        if problem:
            raise ConfigError("data.weight_column", column, "where every row's weight is, a finite number >= 0",
                              f"{of_day}{path}:{number} has {problem}")


def _weight_problem(found: list[str]) -> str:
    """What is wrong with a sampled row's weight (``found``: the texts where weights are), "" if nothing."""
    if len(found) > 1:
        return f"{len(found)} weights"
    if not found or not found[0]:
        return "no weight"
    try:
        weight = float(found[0])
    except ValueError:
        weight = math.nan
    return "" if math.isfinite(weight) and weight >= 0 else f"weight {found[0]!r}, not a finite number >= 0"
