"""The one place that decides what a secret looks like and blanks it out of text: URL user info
(``user:password@``), the values of environment variables and storage options named like a secret
(``*_SECRET_*``, ``*TOKEN*``, ``*PASSWORD*``, ...).

Every error, log line and file a run writes that may quote a URL or a store's message goes through
:func:`redact`; :func:`url_with_password` finds the config values that must not hold one at all
(:func:`components.config_rules.validate` refuses them). It imports nothing of the project, so any layer can use it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

MASK = "***"
SECRET_NAME = re.compile(r"secret|token|passw|credential|access_key|accesskey|api_key|apikey|private|^key$",
                         re.IGNORECASE)
# scheme://<user info>@ : the whole user info goes (a user name alone may be an account name worth hiding too).
# Hydra escapes a sweep's values (s3\://user\:pw@...): the scheme may end in "\://".
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*\\?://)[^/@\s]+@")
# scheme://user:password@ : a URL that carries a password.
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*\\?://[^/@\s:]*:[^/@\s]+@")
# Shorter values are too likely to occur in ordinary text (a 4-letter "key" in storage options is still blanked).
MIN_ENV_SECRET, MIN_OPTION_SECRET = 6, 4


def _secret_values(storage_options: dict | None) -> list[str]:
    values = [v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= MIN_ENV_SECRET]

    def walk(options: Any) -> None:
        if isinstance(options, dict):
            for k, v in options.items():
                if isinstance(v, (dict, list, tuple)):
                    walk(v)
                elif isinstance(v, str) and SECRET_NAME.search(str(k)) and len(v) >= MIN_OPTION_SECRET:
                    values.append(v)
        elif isinstance(options, (list, tuple)):
            for v in options:
                walk(v)

    walk(storage_options or {})
    return sorted(set(values), key=len, reverse=True)


def redact(text: str, storage_options: dict | None = None) -> str:
    """``text`` without URL user info or credential values (from the environment or ``storage_options``)."""
    text = _URL_USERINFO.sub(rf"\1{MASK}@", str(text))
    for secret in _secret_values(storage_options):
        text = text.replace(secret, MASK)
    return text


def redact_files(paths: Iterable[Path]) -> None:
    """Rewrite each existing text file in ``paths`` redacted (what a tool wrote before this code could refuse the
    value, such as Hydra's record of the command line)."""
    for path in paths:
        if path.is_file():
            text = path.read_text()
            clean = redact(text)
            if clean != text:
                path.write_text(clean)


def url_with_password(tree: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted key, value)`` of every string in the nested dicts and lists ``tree`` that holds a URL with a
    password."""
    if isinstance(tree, dict):
        for name, value in tree.items():
            yield from url_with_password(value, f"{key}.{name}" if key else str(name))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from url_with_password(value, f"{key}[{i}]")
    elif isinstance(tree, str) and _URL_PASSWORD.search(tree):
        yield key, tree
