"""Mutual TLS on every PS connection that leaves a host: brpc's own TLS inside each role, and a TLS terminator
(HAProxy) beside each role for gloo's rendezvous store.

Paddle 2.6.2 builds its brpc servers and channels without SSL options; :mod:`components.ps.brpc_tls` gives them the
role's certificate in the role's own process (a preloaded library), so the PS traffic (rows, gradients, table
commands) is encrypted where brpc writes it, with no extra hop, and a connection that does not start with TLS or
brings no certificate of the job's CA is closed. Every role keeps its network endpoint, as without TLS.

gloo's rendezvous store is plain HTTP (Python's server on server 0, gloo's own client), so it alone goes through a
terminator, little traffic at the job's start and end:

* the store's endpoint every role gets is a *local* client port of its own terminator (:func:`store_on_loopback`:
  the store's port plus :data:`LOOPBACK_PORT_OFFSET` on loopback), the same in every process;
* that port forwards over TLS to server 0's network-facing store port (the port the NetworkPolicy opens, as without
  TLS), where server 0's terminator checks the client's certificate and forwards to the store on loopback.

Both ends present a certificate of the job's own CA (:mod:`components.ps.tls_certs`) and verify the other's chain;
a terminator's client also checks the name it dialled (brpc 1.4 checks the chain only).

A role's TLS is configured where it runs (``python -m components.ps.tls -- COMMAND...``, :func:`plan`), from the env
its launcher gives every role (the host layout, the role, its index): it resolves server 0's name first (a name that
does not resolve yet is waited for; HAProxy would refuse to start), writes the terminator's configuration, starts
HAProxy, waits until its ports listen, and becomes the role with the store on loopback and brpc's TLS preloaded
(exec: the container's init stops HAProxy with the container). Its credentials are files in :data:`TLS_DIR`: the
job's CA certificate and the role's certificate and key in one PEM file named by role and index (:func:`pem_name`),
read by HAProxy and brpc alike: a compose service gets its own file (:func:`role_files`), a Kubernetes pod its
role's Secret, which holds every index's (a pod template serves them all).

A worker's own brpc client service (``StartClientService``: the first free port from 8500 on the address the host
name resolves to) speaks TLS too. The compose backend names each container's host ``localhost`` so it binds
loopback all the same; a Kubernetes pod's host name is its DNS name, so there it listens on the pod's address. Not
carried: gloo's TCP transport between workers (barriers and the all-reduce of AUC statistics, on ephemeral ports
whose addresses gloo exchanges through the store) stays plaintext (docs/security.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from components.config import ClusterBackend, ConfigError, CtrConfig, PsTls
from components.ps.contract import (INDEX_ENV, ROLE_ENV, ClusterLayout, Role, layout_from_env, role_env,
                                    wait_until_listening)
from components.ps.brpc_tls import preload_env
from components.ps.network import resolved_own_host
from components.ps.tls_certs import RoleCredentials, issue_job_credentials

LOOPBACK = "127.0.0.1"
# The store's loopback port is its network-facing port plus this (both are bound on server 0's host: its terminator
# accepts on the store's port while the store listens on loopback).
LOOPBACK_PORT_OFFSET = 100
TLS_DIR = "/etc/ctr-ps/tls"  # the job's CA certificate and a role's certificate and key (read-only)
CA_FILE = "ca.crt"
TERMINATOR_START_TIMEOUT_S = 30.0
# How long a role waits for server 0's name to resolve before its terminator starts (a pod's DNS name is published a
# moment after the pod starts; compose's servers start together).
PEER_RESOLVE_TIMEOUT_S = 120.0
# Where the terminator's configuration is written (TLS_DIR is read-only; /tmp is a pod's emptyDir).
RUN_CONF = "/tmp/ctr-ps-tls/haproxy.cfg"
# A PS connection idles through a long save or evaluation; closed, brpc reconnects, but nothing should close it.
IDLE_TIMEOUT = "24h"
# The Kubernetes backends whose pods carry a terminator: their host names and indices are the launcher's to know.
# paddle-operator sets POD_IP and the pods' names itself.
TERMINATED_BACKENDS = (ClusterBackend.jobset, ClusterBackend.trainjob)


def tls_on(cfg: CtrConfig, compose: bool = False) -> bool:
    """Whether the job's roles talk through TLS (``ps.tls``). ``compose``: the job is a compose file's (whatever
    ``cluster.backend`` says), where ``auto`` and ``on`` are on. On JobSet and TrainJob pods ``auto`` is on unless
    ``cluster.mesh_encryption``'s ambient mesh carries the PS plane (``on`` adds TLS under the mesh too). Local
    roles talk on loopback, and a PaddleJob's pods cannot carry a terminator: ``auto`` is off there and ``on``
    refused."""
    mode = cfg.ps.tls
    if compose:
        return mode is not PsTls.off
    if cfg.cluster.backend in TERMINATED_BACKENDS:
        return mode is PsTls.on or (mode is PsTls.auto and not cfg.cluster.mesh_encryption)
    if mode is PsTls.on:
        where = ("its roles talk on this machine's loopback only" if cfg.cluster.backend is ClusterBackend.local
                 else "paddle-operator sets each pod's POD_IP itself, so a role cannot listen behind a terminator; "
                      "cluster.backend=jobset or trainjob carry TLS, cluster.mesh_encryption=true Istio ambient's mTLS")
        raise ConfigError("ps.tls", mode.value, "auto or off for this backend", where)
    return False


def plaintext_warning(cfg: CtrConfig, compose: bool = False) -> str | None:
    """The line the run header and the compose file carry when roles talk across hosts in the clear."""
    local = cfg.cluster.backend is ClusterBackend.local and not compose
    if local or tls_on(cfg, compose) or (cfg.cluster.mesh_encryption and not compose):
        return None
    return (f"warning: ps.tls={cfg.ps.tls.value}: the PS plane (rows, gradients, brpc table commands such as "
            "PS_STOP_SERVER) crosses hosts in plaintext and answers any peer that reaches it (docs/security.md)")


@dataclass(frozen=True)
class Tunnel:
    """One tunnel of a terminator: ``accept`` (host:port) forwarded to ``connect``; a client tunnel dials
    ``connect`` over TLS and checks the peer's certificate names ``peer``; a server tunnel terminates TLS and
    forwards on loopback."""

    name: str
    accept: str
    connect: str
    client: bool
    peer: str = ""


def store_on_loopback(hosts: ClusterLayout) -> ClusterLayout:
    """The layout the roles get with TLS on: ``hosts`` with the rendezvous store's endpoint moved to loopback, at its
    port plus :data:`LOOPBACK_PORT_OFFSET` (where each role's terminator, and server 0's store, listen)."""
    port = _port(hosts.gloo_endpoint) + LOOPBACK_PORT_OFFSET
    return ClusterLayout(hosts.server_endpoints, hosts.worker_endpoints, f"{LOOPBACK}:{port}", hosts.job_id)


def tunnels(hosts: ClusterLayout, role: Role, index: int) -> list[Tunnel]:
    """The tunnels of one role: server 0 terminates TLS on the store's port; every other role dials the store."""
    local = store_on_loopback(hosts).gloo_endpoint
    if role is Role.SERVER and index == 0:
        return [Tunnel("store-in", f"0.0.0.0:{_port(hosts.gloo_endpoint)}", local, client=False)]
    return [Tunnel("store", local, hosts.gloo_endpoint, client=True, peer=_host(hosts.gloo_endpoint))]


def _host(endpoint: str) -> str:
    return endpoint.rsplit(":", 1)[0]


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def terminator_config(role_tunnels: list[Tunnel], pem: str, addresses: Mapping[str, str] = {},
                      tls_dir: str = TLS_DIR) -> str:
    """HAProxy's configuration for a role's tunnels: in TCP mode, one thread, TLS 1.2 at least, the role's
    certificate and key (``pem`` in ``tls_dir``) on both sides, the peer's chain verified against the job's CA alone,
    the dialled name checked; a peer dialled at its address in ``addresses`` (by name where none is given)."""
    cert, ca = f"{tls_dir}/{pem}", f"{tls_dir}/{CA_FILE}"
    lines = ["# Generated by components/ps/tls.py: a role's TLS terminator (mutual TLS, the job's CA only).",
             # One thread: the role's own threads want the cores. 64 KB buffers: fewer reads and writes per message
             # (bench/tls_terminators.py).
             "global", "    nbthread 1", "    tune.bufsize 65536",
             "defaults", "    mode tcp", "    timeout connect 10s",
             f"    timeout client {IDLE_TIMEOUT}", f"    timeout server {IDLE_TIMEOUT}"]
    for tunnel in role_tunnels:
        lines += ["", f"listen {tunnel.name}"]
        if tunnel.client:
            host, port = tunnel.connect.rsplit(":", 1)
            lines += [f"    bind {tunnel.accept}",
                      f"    server {tunnel.peer} {addresses.get(host, host)}:{port} ssl crt {cert} ca-file {ca} "
                      f"verify required verifyhost {tunnel.peer} ssl-min-ver TLSv1.2"]
        else:
            lines += [f"    bind {tunnel.accept} ssl crt {cert} ca-file {ca} verify required ssl-min-ver TLSv1.2",
                      f"    server local {tunnel.connect}"]
    return "\n".join(lines) + "\n"


def listen_endpoints(role_tunnels: list[Tunnel]) -> list[str]:
    """Where a terminator of ``role_tunnels`` listens, as endpoints this host can dial."""
    return [t.accept.replace("0.0.0.0:", f"{LOOPBACK}:", 1) for t in role_tunnels]


def pem_name(role: Role, index: int) -> str:
    """A role's certificate and key, in one PEM file (what HAProxy and brpc read)."""
    return f"{role.value}-{index}.pem"


def role_credentials(hosts: ClusterLayout) -> dict[tuple[Role, int], RoleCredentials]:
    """A new CA for the job and each role's certificate, naming the role's host in ``hosts``."""
    roles = [(Role.SERVER, i) for i in range(hosts.servers)] + [(Role.WORKER, i) for i in range(hosts.workers)]
    issued = issue_job_credentials(hosts.job_id, {_host(hosts.endpoint(*r)): [] for r in roles})
    return {(role, index): issued[_host(hosts.endpoint(role, index))] for role, index in roles}


def role_files(hosts: ClusterLayout) -> dict[tuple[Role, int], dict[str, str]]:
    """What each role's terminator reads from :data:`TLS_DIR` (a compose service's own files), by role: its
    certificate and key, and the CA's certificate of a new CA for the job."""
    return {(role, index): {pem_name(role, index): (issued.cert + issued.key).decode(), CA_FILE: issued.ca.decode()}
            for (role, index), issued in role_credentials(hosts).items()}


@dataclass(frozen=True)
class TerminatorPlan:
    """A role's TLS: its terminator's configuration, where the terminator listens, and the variables that move the
    store onto loopback and turn brpc's TLS on."""

    conf: str
    listens: list[str]
    env: dict[str, str]


def plan(environ: Mapping[str, str], resolve: Callable[[str], str]) -> TerminatorPlan:
    """A role's TLS, from the env its launcher gives (the host layout, :data:`ROLE_ENV`, :data:`INDEX_ENV`): its
    terminator's configuration, server 0 dialled at the address ``resolve`` gives its name, and the variables: the
    role's layout with the store on loopback (:func:`role_env` of :func:`store_on_loopback`) and brpc's TLS with the
    role's credentials (:func:`components.ps.brpc_tls.preload_env`)."""
    hosts = layout_from_env(environ)
    role, index = Role(environ[ROLE_ENV]), int(environ[INDEX_ENV])
    role_tunnels = tunnels(hosts, role, index)
    addresses = {peer: resolve(peer) for peer in dict.fromkeys(t.peer for t in role_tunnels if t.client)}
    brpc = preload_env(f"{TLS_DIR}/{pem_name(role, index)}", f"{TLS_DIR}/{CA_FILE}", environ)
    return TerminatorPlan(terminator_config(role_tunnels, pem_name(role, index), addresses),
                          listen_endpoints(role_tunnels), {**role_env(store_on_loopback(hosts), role, index), **brpc})


def _peer_address(host: str) -> str:
    return resolved_own_host(host, PEER_RESOLVE_TIMEOUT_S, what="a peer's host", key="the PS layout")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--":
        print("usage: python -m components.ps.tls -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    command = argv[1:]
    try:
        role_plan = plan(os.environ, _peer_address)
    except OSError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    Path(RUN_CONF).parent.mkdir(parents=True, exist_ok=True)
    Path(RUN_CONF).write_text(role_plan.conf)
    terminator = subprocess.Popen(["haproxy", "-db", "-f", RUN_CONF])
    try:
        # hold_s=0: a client tunnel closes what it accepted while its peer is not up yet, which is no matter here.
        wait_until_listening(role_plan.listens, TERMINATOR_START_TIMEOUT_S, hold_s=0)
    except TimeoutError:
        terminator.kill()
        print(f"error: HAProxy ({RUN_CONF}) did not listen on {role_plan.listens} within "
              f"{TERMINATOR_START_TIMEOUT_S:.0f}s (exit status {terminator.poll()}); see its lines above",
              file=sys.stderr, flush=True)
        return 1
    os.environ.update(role_plan.env)
    # HAProxy stays this process's child; it ends with the container (its init stops what is left).
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
