"""brpc's own mutual TLS in a PS role: the library that turns it on (``brpc_tls.cc``), where it is, how it is built.

Paddle 2.6.2 builds its brpc servers and channels without SSL options, but the brpc inside ``libpaddle.so`` has SSL.
``brpc_tls.cc`` is a small library preloaded into a role (``LD_PRELOAD``) that gives every brpc server and channel
of the process the role's certificate and the job's CA (:data:`PEM_ENV`, :data:`CA_ENV`), TLS 1.2 only, fails a
connection that does not start with TLS, and mends brpc 1.4's SSL path where the job met its bugs. The PS traffic
then crosses hosts encrypted with no extra hop: a TLS terminator beside each role had cost the compose job 0.74x
its examples/s, in-process TLS 0.90x (medians, bench/results/tls.md). It is for ``paddlepaddle==2.6.2`` only
(brpc 1.4.0's structs): the library checks their defaults before writing and aborts the role otherwise.

The image builds it (containers/Dockerfile: ``python3 brpc_tls.py OUT``, needing nothing but g++) at
:data:`IMAGE_LIBRARY`; elsewhere :data:`LIBRARY_ENV` names a library :func:`build` made.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Optional

SOURCE = Path(__file__).with_name("brpc_tls.cc")
IMAGE_LIBRARY = "/usr/local/lib/ctr-ps/libbrpc_tls.so"
LIBRARY_ENV = "CTR_PS_BRPC_TLS_LIB"  # where the library is, if not at IMAGE_LIBRARY
PEM_ENV = "CTR_PS_TLS_PEM"  # the role's certificate and key, one PEM file (read by brpc_tls.cc)
CA_ENV = "CTR_PS_TLS_CA"  # the job's CA certificate (read by brpc_tls.cc)


def build(out: Path) -> Path:
    """Compile :data:`SOURCE` into the shared library ``out`` (g++, C++17); raises with g++'s own lines."""
    out.parent.mkdir(parents=True, exist_ok=True)
    command = ["g++", "-O2", "-shared", "-fPIC", "-std=c++17", "-Wall", "-Wl,--no-undefined", "-o", str(out),
               str(SOURCE), "-ldl"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building {out} from {SOURCE} failed ({' '.join(command)}):\n{done.stderr}")
    return out


def library(environ: os._Environ | dict = os.environ) -> str:
    """The library a role preloads; an OSError naming the fix when it is missing."""
    path = environ.get(LIBRARY_ENV) or IMAGE_LIBRARY
    if not Path(path).is_file():
        raise FileNotFoundError(f"ps.tls: the brpc TLS library {path} is missing (the image builds it; elsewhere "
                                f"`python -m components.ps.brpc_tls OUT` builds one and {LIBRARY_ENV}=OUT names it)")
    return path


def preload_env(pem: str, ca: str, environ: os._Environ | dict = os.environ) -> dict[str, str]:
    """The variables that turn brpc's TLS on in a role started with them: the library first in ``LD_PRELOAD``,
    the role's PEM file and the job's CA certificate."""
    preload = " ".join(p for p in (library(environ), environ.get("LD_PRELOAD", "")) if p)
    return {"LD_PRELOAD": preload, PEM_ENV: pem, CA_ENV: ca}


def client_context(environ: os._Environ | dict = os.environ) -> Optional[ssl.SSLContext]:
    """What a role's own Python code dials its brpc ports with (a server's ``/health``): the role's certificate and
    the job's CA when brpc's TLS is on in this process (:data:`PEM_ENV` set), else None (plaintext)."""
    pem = environ.get(PEM_ENV)
    if not pem:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # as brpc's own channels: the job's CA is the trust, not the name
    context.load_verify_locations(environ[CA_ENV])
    context.load_cert_chain(pem)
    return context


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m components.ps.brpc_tls OUT.so", file=sys.stderr)
        sys.exit(2)
    print(build(Path(sys.argv[1])))
