"""Mutual TLS on every PS connection that leaves a host, by a TLS terminator (stunnel) beside each role.

Paddle 2.6.2's brpc cannot be told to use TLS, and gloo's rendezvous store is plain HTTP, so with TLS on every role
listens on its host's loopback only and stunnel carries what crosses hosts:

* a role's peers are dialled at *local* stunnel client ports, one per peer endpoint, on the same loopback port number
  the peer itself listens on (:func:`loopback_layout`): so the endpoint lists every role gets (:func:`role_env`) are
  one list of ``127.0.0.1:port`` entries, the same in every process, and a server still finds its own entry in it;
* each client port forwards over TLS to the peer host's network-facing port (``cluster.paddle_port`` for a server's
  PS port, the gloo port for server 0's store: the ports the NetworkPolicy opens, as without TLS), where the peer's
  stunnel server checks the client's certificate and forwards to the peer's loopback port.

A compose job's files (certificate, key, CA, stunnel configuration) are made when its compose file is generated
(:func:`role_files`); a Kubernetes pod's template serves every index of its role, so its terminator is configured in
the pod (:func:`pod_plan`) from the env the template gives (the host layout, the role, the index), with the
certificates of every index of the role in one Secret (:func:`role_credentials`), named ``<role>-<index>.crt``/``.key``.

Both ends present a certificate of the job's own CA (:mod:`components.ps.tls_certs`) and verify the other's chain;
a client also checks the name it dialled. A connection without the job's certificate never reaches a PS or store
port. A worker's own brpc client service (``StartClientService``: the first free port from 8500 on the address the
host name resolves to) must stay off the network too: the compose backend names each container's host ``localhost``
so it binds loopback; a Kubernetes pod's host name is its DNS name (JobSet sets it), so there that port stays on the
pod's address, plaintext, reachable by the job's own pods only (the NetworkPolicy). Not carried: gloo's TCP transport between workers (barriers and the all-reduce of AUC
statistics, on ephemeral ports whose addresses gloo exchanges through the store): it binds the host's network
interface (:data:`TRANSPORT_HOST_ENV`, :mod:`components.ps.network`) and stays plaintext (docs/security.md).

:func:`stunnel_config` writes a role's stunnel configuration; ``python -m components.ps.tls CONF -- COMMAND...``
starts stunnel on it, waits until its ports listen, then becomes the role (exec: the container's init stops stunnel
with the container); ``python -m components.ps.tls --pod -- COMMAND...`` first writes the pod's configuration
(:func:`pod_plan`) and hands the role the loopback layout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from components.config import ClusterBackend, ConfigError, CtrConfig, PsTls
from components.ps.contract import INDEX_ENV, ROLE_ENV, ClusterLayout, Role, role_env, wait_until_listening
from components.ps.network import TRANSPORT_HOST_ENV
from components.ps.tls_certs import RoleCredentials, issue_job_credentials

LOOPBACK = "127.0.0.1"
# A role's loopback port is its network-facing port plus this (both are bound on the same host: a server's stunnel
# accepts on paddle_port while the server listens on loopback) and its index among the servers (each server's entry
# in the endpoint list is distinct).
LOOPBACK_PORT_OFFSET = 100
TLS_DIR = "/etc/ctr-ps/tls"  # a role's certificate, key, the job's CA and its stunnel configuration
CERT_FILE, KEY_FILE, CA_FILE, CONF_FILE = "role.crt", "role.key", "ca.crt", "stunnel.conf"
STUNNEL_START_TIMEOUT_S = 30.0
# Where a pod's terminator writes its configuration (the Secret at TLS_DIR is read-only; /tmp is the pod's emptyDir).
POD_CONF = "/tmp/ctr-ps-tls/stunnel.conf"
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
    """One stunnel service: ``accept`` (host:port) forwarded to ``connect``; a client tunnel dials ``connect`` over
    TLS and checks the peer's certificate names ``peer``; a server tunnel terminates TLS and forwards on loopback."""

    name: str
    accept: str
    connect: str
    client: bool
    peer: str = ""


def loopback_layout(hosts: ClusterLayout) -> ClusterLayout:
    """The layout the roles get with TLS on: every endpoint of ``hosts`` (one host per role) moved to loopback at its
    port plus :data:`LOOPBACK_PORT_OFFSET` plus its index (servers, then workers), the store likewise."""
    def local(endpoint: str, index: int) -> str:
        return f"{LOOPBACK}:{int(endpoint.rsplit(':', 1)[1]) + LOOPBACK_PORT_OFFSET + index}"

    servers = tuple(local(ep, i) for i, ep in enumerate(hosts.server_endpoints))
    workers = tuple(local(ep, hosts.servers + i) for i, ep in enumerate(hosts.worker_endpoints))
    return ClusterLayout(servers, workers, local(hosts.gloo_endpoint, 0), hosts.job_id)


def tunnels(hosts: ClusterLayout, role: Role, index: int) -> list[Tunnel]:
    """The stunnel services of one role: a server terminates TLS on its PS port (server 0 on the store's too); a
    worker dials every server and the store, a server other than 0 the store (servers do not dial each other)."""
    local = loopback_layout(hosts)
    store = Tunnel("store", f"{LOOPBACK}:{_port(local.gloo_endpoint)}", hosts.gloo_endpoint, client=True,
                   peer=_host(hosts.gloo_endpoint))
    if role is Role.SERVER:
        own = [Tunnel("ps-in", f"0.0.0.0:{_port(hosts.server_endpoints[index])}", local.server_endpoints[index],
                      client=False)]
        if index == 0:
            return own + [Tunnel("store-in", f"0.0.0.0:{_port(hosts.gloo_endpoint)}", local.gloo_endpoint, client=False)]
        return own + [store]
    return [Tunnel(f"ps-{i}", f"{LOOPBACK}:{_port(local.server_endpoints[i])}", endpoint, client=True,
                   peer=_host(endpoint)) for i, endpoint in enumerate(hosts.server_endpoints)] + [store]


def _host(endpoint: str) -> str:
    return endpoint.rsplit(":", 1)[0]


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def stunnel_config(role_tunnels: list[Tunnel], tls_dir: str = TLS_DIR, cert: str = CERT_FILE,
                   key: str = KEY_FILE) -> str:
    """stunnel's configuration for a role's tunnels: in the foreground (its log on stderr), TLS 1.2 at least, the
    role's certificate (``cert``, ``key`` in ``tls_dir``) on both sides, the peer's chain verified against the job's
    CA alone, the dialled name checked."""
    lines = ["; Generated by components/ps/tls.py: a role's TLS terminator (mutual TLS, the job's CA only).",
             "foreground = yes", "pid =", "syslog = no", "debug = warning",
             f"cert = {tls_dir}/{cert}", f"key = {tls_dir}/{key}", f"CAfile = {tls_dir}/{CA_FILE}",
             # verifyChain: the peer must present a certificate that chains to CAfile (no system CAs are loaded).
             "verifyChain = yes", "requireCert = yes", "sslVersionMin = TLSv1.2",
             # Nagle off: brpc's small requests must not wait for a full segment in the tunnel.
             "socket = l:TCP_NODELAY=1", "socket = r:TCP_NODELAY=1"]
    for tunnel in role_tunnels:
        lines += ["", f"[{tunnel.name}]", f"accept = {tunnel.accept}", f"connect = {tunnel.connect}"]
        if tunnel.client:
            # delay: resolve the peer when a connection comes (its DNS name may not exist yet when this starts).
            lines += ["client = yes", f"checkHost = {tunnel.peer}", "delay = yes"]
    return "\n".join(lines) + "\n"


def accept_endpoints(conf_text: str) -> list[str]:
    """Where the stunnel of ``conf_text`` listens, as endpoints this host can dial."""
    accepts = [line.split("=", 1)[1].strip() for line in conf_text.splitlines() if line.startswith("accept =")]
    return [a.replace("0.0.0.0:", f"{LOOPBACK}:", 1) for a in accepts]


def role_credentials(hosts: ClusterLayout) -> dict[tuple[Role, int], RoleCredentials]:
    """A new CA for the job and each role's certificate, naming the role's host in ``hosts``."""
    roles = [(Role.SERVER, i) for i in range(hosts.servers)] + [(Role.WORKER, i) for i in range(hosts.workers)]
    issued = issue_job_credentials(hosts.job_id, {_host(hosts.endpoint(*r)): [] for r in roles})
    return {(role, index): issued[_host(hosts.endpoint(role, index))] for role, index in roles}


def role_files(hosts: ClusterLayout) -> dict[tuple[Role, int], dict[str, str]]:
    """Everything each role's terminator reads from :data:`TLS_DIR`, by role: its certificate and key (named by its
    host in ``hosts``), the CA's certificate of a new CA for the job, and its stunnel configuration."""
    return {(role, index): {CERT_FILE: issued.cert.decode(), KEY_FILE: issued.key.decode(), CA_FILE: issued.ca.decode(),
                            CONF_FILE: stunnel_config(tunnels(hosts, role, index))}
            for (role, index), issued in role_credentials(hosts).items()}


def pod_key_names(role: Role, index: int) -> tuple[str, str]:
    """The names of a role's certificate and key in its role's Secret (one Secret serves every index of a role)."""
    return f"{role.value}-{index}.crt", f"{role.value}-{index}.key"


def pod_plan(environ: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """A pod's terminator, from the env its template gives (the host layout, :data:`ROLE_ENV`, :data:`INDEX_ENV`):
    its stunnel configuration (certificates from the role's Secret at :data:`TLS_DIR`) and the variables that
    move the role onto the loopback layout (:func:`role_env` of :func:`loopback_layout`, :func:`transport_env`)."""
    hosts = ClusterLayout(tuple(environ["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")),
                          tuple(environ["PADDLE_TRAINER_ENDPOINTS"].split(",")),
                          environ["PADDLE_GLOO_HTTP_ENDPOINT"], environ["SYS_JOB_ID"])
    role, index = Role(environ[ROLE_ENV]), int(environ[INDEX_ENV])
    cert, key = pod_key_names(role, index)
    conf = stunnel_config(tunnels(hosts, role, index), cert=cert, key=key)
    return conf, {**role_env(loopback_layout(hosts), role, index), **transport_env(hosts, role, index)}


def transport_env(hosts: ClusterLayout, role: Role, index: int) -> dict[str, str]:
    """The variable that keeps gloo's transport on the host's network interface while POD_IP is loopback."""
    return {TRANSPORT_HOST_ENV: _host(hosts.endpoint(role, index))}


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m components.ps.tls {STUNNEL_CONF | --pod} -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    conf, command = argv[0], argv[2:]
    if conf == "--pod":
        text, env = pod_plan(os.environ)
        conf = POD_CONF
        Path(conf).parent.mkdir(parents=True, exist_ok=True)
        Path(conf).write_text(text)
        os.environ.update(env)
    with open(conf) as f:
        endpoints = accept_endpoints(f.read())
    stunnel = subprocess.Popen(["stunnel", conf])
    try:
        # hold_s=0: a client tunnel closes what it accepted while its peer is not up yet, which is no matter here.
        wait_until_listening(endpoints, STUNNEL_START_TIMEOUT_S, hold_s=0)
    except TimeoutError:
        stunnel.kill()
        print(f"error: stunnel ({conf}) did not listen on {endpoints} within {STUNNEL_START_TIMEOUT_S:.0f}s "
              f"(exit status {stunnel.poll()}); see its lines above", file=sys.stderr, flush=True)
        return 1
    # stunnel stays this process's child; it ends with the container (its init stops what is left).
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
