"""Kubernetes resource quantities, one grammar for every key that takes one (memory in bytes, CPUs in cores)."""

from __future__ import annotations

import re
from typing import Any

from components.config import ConfigError

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?|\.[0-9]+)([KMGTPE]i?|k)?$")
_UNITS = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
          "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_CPU = re.compile(r"^([0-9]+(?:\.[0-9]+)?|\.[0-9]+)m?$")


def kubernetes_bytes(quantity: Any, key: str = "cluster.servers.memory") -> float:
    """A Kubernetes memory quantity in bytes: a number with an optional suffix (``8Gi``, ``512M``)."""
    match = _QUANTITY.match(str(quantity).strip())
    if not match:
        raise ConfigError(key, quantity, "a Kubernetes memory quantity such as 8Gi or 8000M")
    return float(match[1]) * _UNITS[match[2] or ""]


def check_cpu(quantity: Any, key: str, allowed: str) -> None:
    """A Kubernetes CPU quantity: cores (``2``, ``0.5``) or millicores (``500m``)."""
    if not _CPU.match(str(quantity).strip()):
        raise ConfigError(key, quantity, allowed)
