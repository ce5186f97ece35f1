"""The text of ``python -m pipelines.ctr --help``, generated from ``conf/`` and the schema so that it cannot go stale.

Hydra prints ``hydra.help.template``; ``conf/config.yaml`` sets it to ``${ctr_help:}``, a resolver
(:func:`register_help`) that calls :func:`help_text` with the composed config, so the keys show the values the
given overrides compose (``--help experiment=tiny`` shows its 1 server). It lists every config group with each
option and that option file's first comment line, the most used keys with the schema's comment on each, and
example commands.
"""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from components.config import CtrConfig

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
# The keys a user sets most, in the order a run is described: data, model, job, checkpoint, evaluation, the run.
USEFUL_KEYS = ("data.uri", "data.rows", "model.learning_rate", "table.embedding_dim", "table.learning_rate",
               "ps.servers", "ps.workers", "ps.epochs", "ps.batch_size", "checkpoint.uri", "checkpoint.resume",
               "eval.min_auc", "plan", "verbose")
EXAMPLES = (
    ("a seconds-long smoke run", "python -m pipelines.ctr experiment=tiny"),
    ("real Criteo TSV, DeepFM, what would run",
     "python -m pipelines.ctr data=criteo data.uri='/data/day_0*.tsv' model=deepfm plan=true"),
    ("compile and submit to Kubeflow", "python -m pipelines.ctr +cluster=prod checkpoint.uri=s3://bucket/ctr/run-1 "
                                       "cluster.host=https://kubeflow.example.com/pipeline"),
)
_DEFAULTS_ENTRY = re.compile(r"^  - (?:optional )?(?P<group>\w+): (?P<option>\w+)\s*(?:#\s*(?P<example>.*))?$")
_FIELD = re.compile(r"^    (\w+): [^=]+?(?:= .*?)?(?:  # (?P<comment>.*))?$")


def option_description(path: Path) -> str:
    """The first sentence of an option file's opening comment (Hydra's ``# @package`` directive and indented
    command lines aside)."""
    text = []
    for line in path.read_text().splitlines():
        if line.startswith("# @package"):
            continue
        if not line.startswith("#") or line.startswith("#  "):
            break
        text.append(line.lstrip("#").strip())
    return _first_sentence(" ".join(text)).rstrip(":")


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=\.) (?=[A-Z])", text)[0]


def config_groups() -> dict[str, dict[str, str]]:
    """Group -> option -> description, for every option file under ``conf/``."""
    return {group.name: {option.stem: option_description(option) for option in sorted(group.glob("*.yaml"))}
            for group in sorted(CONF_DIR.iterdir()) if group.is_dir() and any(group.glob("*.yaml"))}


def group_usage() -> dict[str, str]:
    """Group -> how ``conf/config.yaml``'s defaults list chooses it: ``default <option>``, or for an optional
    group the example its line's comment gives (``experiment=tiny``)."""
    usage = {}
    for line in (CONF_DIR / "config.yaml").read_text().splitlines():
        found = _DEFAULTS_ENTRY.match(line)
        if found:
            usage[found["group"]] = (f"default {found['option']}" if found["option"] != "null"
                                     else f"none by default: {found['example'] or found['group'] + '=...'}")
    return usage


def field_comments(cls: type) -> dict[str, str]:
    """Field -> the comment on its line in the schema's source, or else the comment block just above it."""
    comments, above = {}, []
    for line in inspect.getsource(cls).splitlines()[1:]:
        if line.strip().startswith("#"):
            above.append(line.strip().lstrip("#").strip())
            continue
        found = _FIELD.match(line)
        if found:
            comments[found[1]] = found["comment"] or " ".join(above)
        above = []
    return comments


def key_description(key: str) -> str:
    """The schema's comment on ``key`` (``group.field`` or a top-level field), up to its first sentence's end."""
    *group, name = key.split(".")
    owner = CtrConfig
    for part in group:
        owner = typing.get_type_hints(owner)[part]
    comment = field_comments(owner).get(name, "")
    return _first_sentence(comment).removesuffix("...").rstrip(".") + ("..." if comment.endswith("...") else "")


def help_text(root: Any = None) -> str:
    groups, usage = config_groups(), group_usage()
    lines = ["python -m pipelines.ctr [group=option ...] [key=value ...]: the CTR pipeline (data prep -> parameter-"
             "server training -> evaluation -> export), locally or on Kubeflow.", "", "Config groups (group=option):"]
    for group, options in groups.items():
        lines.append(f"  {group} ({usage.get(group, f'added with +{group}=...')})")
        width = max(map(len, options))
        lines += [f"    {option:<{width}}  {description}" for option, description in options.items()]
    lines += ["", "Most used keys (key=value; current value in brackets):"]
    width = max(map(len, USEFUL_KEYS))
    # Unresolved: ${run_dir} has no value before a run starts, and its interpolation says more than a path would.
    composed = OmegaConf.to_container(root, resolve=False, enum_to_str=True) if root is not None else {}
    for key in USEFUL_KEYS:
        value: Any = composed
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        lines.append(f"  {key:<{width}}  {key_description(key)} [{shown}]")
    lines += ["", "Examples:"]
    lines += [f"  {command}\n      {what}" for what, command in EXAMPLES]
    lines += ["", "Every key and its default: components/config.py; the composed config of a command: add --cfg job.",
              "Errors a user can fix end in one line (exit status 2; 3: a failed Kubeflow submission); "
              "HYDRA_FULL_ERROR=1 shows the traceback."]
    # Hydra fills the template with string.Template: a literal "$" must be doubled.
    return "\n".join(lines).replace("$", "$$")


def register_help() -> None:
    """The ``ctr_help`` resolver ``hydra.help.template`` calls (``_root_``: the composed config)."""
    if not OmegaConf.has_resolver("ctr_help"):
        OmegaConf.register_new_resolver("ctr_help", lambda _root_: help_text(_root_))
