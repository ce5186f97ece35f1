#!/usr/bin/env python3
"""A client without the job's certificate, on the job's network: what do the PS, store and worker ports give it?

    python ps_stranger.py --cmd 12 ps-0:36000 ps-1:36000 ps-0:36018 worker-0:8500

For each endpoint, three tries, one JSON line each (containers/tls_check.sh reads them):

* ``plain``: a brpc (baidu_std) request to ``paddle.distributed.PsService.service`` with ``cmd_id`` ``--cmd``
  (12 is PS_STOP_SERVER, in the PsCmdID enum of the wheel's sendrecv.proto), in the clear;
* ``tls-none``: the same inside TLS, with no client certificate;
* ``tls-foreign``: the same inside TLS, with a certificate of another CA (a job of its own).

``result``: ``refused`` (no TCP connection), ``closed`` (connected, then closed or reset, or the TLS handshake
failed: the request reached nothing), ``silent`` (nothing came back within the wait) or ``answered`` (bytes came
back; ``brpc`` says whether they are a brpc response). Runs in the pipeline image (the foreign certificate is made
by its components.ps.tls_certs).
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import struct
import sys
import tempfile
from pathlib import Path

WAIT_S = 3.0


def _varint(value: int) -> bytes:
    out = b""
    while True:
        byte, value = value & 0x7F, value >> 7
        out += bytes([byte | (0x80 if value else 0)])
        if not value:
            return out


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def brpc_request(cmd_id: int) -> bytes:
    """A baidu_std frame: "PRPC", body size, meta size (big-endian), RpcMeta, then the PsRequestMessage."""
    request_meta = _field(1, b"paddle.distributed.PsService") + _field(2, b"service")
    meta = _field(1, request_meta) + _field(4, 1)  # request, correlation_id
    message = _field(1, cmd_id) + _field(2, 0) + _field(4, 0)  # cmd_id, table_id, client_id
    return b"PRPC" + struct.pack(">II", len(meta) + len(message), len(meta)) + meta + message


def foreign_context(directory: Path) -> ssl.SSLContext:
    from components.ps.tls_certs import issue_job_credentials  # the image's package: a CA of a job of its own

    issued = issue_job_credentials("stranger", {"stranger": []})["stranger"]
    (directory / "c.pem").write_bytes(issued.cert)
    (directory / "k.pem").write_bytes(issued.key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.load_cert_chain(directory / "c.pem", directory / "k.pem")
    return context


def attempt(endpoint: str, frame: bytes, context: ssl.SSLContext | None) -> dict:
    host, port = endpoint.rsplit(":", 1)
    try:
        raw = socket.create_connection((host, int(port)), timeout=WAIT_S)
    except OSError as err:
        return {"result": "refused", "why": str(err)}
    try:
        conn = context.wrap_socket(raw, server_hostname=host) if context else raw
        conn.settimeout(WAIT_S)
        conn.sendall(frame)
        reply = conn.recv(4096)
    except socket.timeout:
        return {"result": "silent"}
    except (OSError, ssl.SSLError) as err:
        return {"result": "closed", "why": str(err)}
    finally:
        raw.close()
    if not reply:
        return {"result": "closed", "why": "EOF"}
    return {"result": "answered", "brpc": reply.startswith(b"PRPC"), "bytes": len(reply)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cmd", type=int, default=12, help="the PsCmdID to send (12: PS_STOP_SERVER)")
    parser.add_argument("endpoints", nargs="+")
    args = parser.parse_args(argv)
    frame = brpc_request(args.cmd)
    # Its own address first: the captures of the job's traffic leave its probes out.
    print(json.dumps({"stranger": socket.gethostbyname(socket.gethostname())}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tries = {"plain": None, "tls-none": ssl._create_unverified_context(), "tls-foreign": foreign_context(Path(tmp))}
        for endpoint in args.endpoints:
            for name, context in tries.items():
                print(json.dumps({"endpoint": endpoint, "try": name, **attempt(endpoint, frame, context)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
