"""Where a PS process listens: every socket on the process's own host (``POD_IP``), none on all interfaces.

Paddle 2.6.2 binds two kinds of sockets of its own choosing:

* server 0's gloo rendezvous store (``paddle.distributed.fleet.utils.http_server.KVHTTPServer``) binds
  ``('', port)``: every interface. :func:`bind_to_own_host` makes it bind the host of
  ``PADDLE_GLOO_HTTP_ENDPOINT`` (server 0's own host in every layout of :mod:`components.ps.contract`);
* gloo's TCP transport, which workers use for barriers and all-reduce on ephemeral ports, binds the address
  of the interface it is given, and Paddle gives it none (``Gloo._iface = ""``), so it binds whatever the
  machine's host name resolves to (on many machines the LAN address). It is given the interface that holds
  ``POD_IP``'s address instead.

The brpc PS servers bind ``POD_IP:PADDLE_PORT`` themselves. A host that does not resolve to an address of the
machine leaves Paddle's choice in place (a pod's own DNS name before it is published), so a job starts
wherever it did before; on Kubernetes the NetworkPolicy admits only the job's own pods anyway.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from typing import Optional

_SIOCGIFADDR = 0x8915


def _interface_address(name: str) -> Optional[str]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no IPv4 address
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_of(host: str) -> Optional[str]:
    """The network interface whose IPv4 address ``host`` resolves to (a loopback address: ``lo``), or None."""
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return None
    names = [name for _, name in socket.if_nameindex()]
    for name in names:
        if _interface_address(name) == address:
            return name
    if ipaddress.ip_address(address).is_loopback:
        return next((n for n in names if _interface_address(n) == "127.0.0.1"), None)
    return None


def bind_to_own_host() -> None:
    """Patch Paddle (before ``fleet.init``) so its gloo store and transport bind this process's host."""
    from paddle.distributed.fleet.base import role_maker
    from paddle.distributed.fleet.utils import http_server

    store_host = os.environ.get("PADDLE_GLOO_HTTP_ENDPOINT", "").rpartition(":")[0]
    if store_host:
        def server_bind(self, _host=store_host):
            port = self.server_address[1]  # KVHTTPServer passes ('', port)
            try:
                self.server_address = (_host, port)
                http_server.HTTPServer.server_bind(self)
            except OSError:  # a pod whose own DNS name does not resolve yet: every interface, as Paddle does
                self.server_address = ("", port)
                http_server.HTTPServer.server_bind(self)

        http_server.KVHTTPServer.server_bind = server_bind
    iface = interface_of(os.environ.get("POD_IP", ""))
    if iface:
        init_http = role_maker.Gloo._init_http

        def init_http_on(self, *args, **kwargs):
            self._iface = iface  # Gloo.init has just set it to "" (the host name's address)
            return init_http(self, *args, **kwargs)

        role_maker.Gloo._init_http = init_http_on
