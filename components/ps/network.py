"""Where a PS process listens: every socket on the process's own host (``POD_IP``), none on all interfaces.

Paddle 2.6.2 binds two kinds of sockets of its own choosing:

* server 0's gloo rendezvous store (``paddle.distributed.fleet.utils.http_server.KVHTTPServer``) binds
  ``('', port)``: every interface. :func:`bind_to_own_host` makes it bind the host of
  ``PADDLE_GLOO_HTTP_ENDPOINT`` (server 0's own host in every layout of :mod:`components.ps.contract`);
* gloo's TCP transport, which workers use for barriers and all-reduce on ephemeral ports, binds the address
  of the interface it is given, and Paddle gives it none (``Gloo._iface = ""``), so it binds whatever the
  machine's host name resolves to (on many machines the LAN address). It is given the interface that holds
  ``POD_IP``'s address instead: peers dial it from other hosts.

The brpc PS servers bind ``POD_IP:PADDLE_PORT`` themselves. Nothing falls back to every interface: a store host
that does not resolve yet (a pod's own DNS name before its headless service publishes it) is waited for, up to
:data:`RESOLVE_TIMEOUT_S`, and then fails the process naming the host. A transport interface that cannot be found
leaves Paddle's choice, the one address the machine's host name resolves to.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import time
from typing import MutableMapping, Optional

_SIOCGIFADDR = 0x8915
# How long server 0 waits for its own DNS name to resolve before its rendezvous store gives up.
RESOLVE_TIMEOUT_S = 60.0


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


def resolved_own_host(host: str, timeout_s: float = RESOLVE_TIMEOUT_S, poll_s: float = 1.0,
                      what: str = "the rendezvous store's host", key: str = "PADDLE_GLOO_HTTP_ENDPOINT") -> str:
    """``host``'s address once it resolves (a pod's DNS name is published a moment after the pod starts); an
    OSError naming it after ``timeout_s``, rather than listening on every interface."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.gethostbyname(host)
        except OSError as err:
            if time.monotonic() >= deadline:
                raise OSError(f"{what} {host!r} ({key}) did not resolve within {timeout_s:.0f}s ({err}); it is not "
                              "bound to every interface instead") from None
            time.sleep(poll_s)


def pin_addresses(environ: MutableMapping[str, str], timeout_s: float) -> None:
    """Replace, in Paddle's variables, the host names this process hands to brpc and gloo by their addresses,
    resolved here once each, waiting for names not yet published.

    brpc looks a name up again on its own and a failed lookup is fatal inside Paddle: "Brpc Start failed ... Host
    name lookup failure" and a segfault, in 2 of 19 podman compose runs, although Python had just resolved the same
    name (podman's DNS answers nothing for a moment while it reloads, as a container joins the network). An address
    needs no lookup. A process resolves its own name, the rendezvous store's and, as a worker, the servers' (it
    connects to them); a server never waits for a worker's name (a worker pod may be scheduled much later).
    """
    addresses: dict[str, str] = {}

    def pinned(endpoint: str, what: str, key: str) -> str:
        host, _, port = endpoint.rpartition(":")
        if host not in addresses:
            addresses[host] = resolved_own_host(host, timeout_s, what=what, key=key)
        return f"{addresses[host]}:{port}"

    port = environ.get("PADDLE_PORT", "")
    own_endpoint = f"{environ.get('POD_IP', '')}:{port}"
    if environ.get("POD_IP"):
        environ["POD_IP"] = pinned(own_endpoint, "this process's host", "POD_IP").rpartition(":")[0]
    if environ.get("PADDLE_GLOO_HTTP_ENDPOINT"):
        environ["PADDLE_GLOO_HTTP_ENDPOINT"] = pinned(environ["PADDLE_GLOO_HTTP_ENDPOINT"],
                                                      "the rendezvous store's host", "PADDLE_GLOO_HTTP_ENDPOINT")
    if environ.get("PADDLE_PSERVERS_IP_PORT_LIST"):
        worker = environ.get("TRAINING_ROLE") == "TRAINER"
        # A server's POD_IP:PADDLE_PORT must stay equal to its entry in the list: Paddle finds its index so.
        environ["PADDLE_PSERVERS_IP_PORT_LIST"] = ",".join(
            pinned(endpoint, "a server's host", "PADDLE_PSERVERS_IP_PORT_LIST")
            if worker or endpoint == own_endpoint else endpoint
            for endpoint in environ["PADDLE_PSERVERS_IP_PORT_LIST"].split(","))


def bind_to_own_host() -> None:
    """Patch Paddle (before ``fleet.init``) so its gloo store and transport bind this process's host."""
    from paddle.distributed.fleet.base import role_maker
    from paddle.distributed.fleet.utils import http_server

    store_host = os.environ.get("PADDLE_GLOO_HTTP_ENDPOINT", "").rpartition(":")[0]
    if store_host:
        def server_bind(self, _host=store_host):
            self.server_address = (resolved_own_host(_host), self.server_address[1])  # Paddle passes ('', port)
            http_server.HTTPServer.server_bind(self)

        http_server.KVHTTPServer.server_bind = server_bind
    iface = interface_of(os.environ.get("POD_IP", ""))
    if iface:
        init_http = role_maker.Gloo._init_http

        def init_http_on(self, *args, **kwargs):
            self._iface = iface  # Gloo.init has just set it to "" (the host name's address)
            return init_http(self, *args, **kwargs)

        role_maker.Gloo._init_http = init_http_on
