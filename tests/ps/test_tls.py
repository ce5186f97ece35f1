"""Mutual TLS on the PS plane (components/ps/tls.py, tls_certs.py): the per-job CA and its certificates, the
address rewrite, the terminators' configurations, ``ps.tls`` and its ``auto`` resolution per backend. A real
terminator (HAProxy) pair carries a connection when it holds the job's certificates and refuses one that does not
(containers/tls_check.sh does the same on the compose job's network, with Paddle behind it)."""

from __future__ import annotations

import dataclasses
import shutil
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from components.config import ClusterBackend, ConfigError, CtrConfig, PsTls
from components.ps import brpc_tls, tls
from components.ps.contract import Role, endpoint_accepts, host_layout, role_env, wait_until_listening
from components.ps.tls_certs import issue_job_credentials

HOSTS = host_layout(lambda role, i: f"{'ps' if role is Role.SERVER else 'worker'}-{i}", 2, 3, 36000, 36018, "job-a")


def config(backend: str = "local", mode: str = "auto", mesh: bool = False) -> CtrConfig:
    cfg = CtrConfig()
    return dataclasses.replace(cfg, ps=dataclasses.replace(cfg.ps, tls=PsTls[mode]),
                               cluster=dataclasses.replace(cfg.cluster, backend=ClusterBackend[backend],
                                                           mesh_encryption=mesh))


def verifies(cert_pem: bytes, ca_pem: bytes) -> bool:
    cert, ca = x509.load_pem_x509_certificate(cert_pem), x509.load_pem_x509_certificate(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, InvalidSignature):
        return False
    return True


# -- ps.tls -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend, mode, mesh, compose, on", [
    ("local", "auto", False, False, False),      # loopback only
    ("local", "off", False, False, False),
    ("local", "auto", False, True, True),        # a compose job, whatever cluster.backend says
    ("local", "on", False, True, True),
    ("local", "off", False, True, False),
    ("jobset", "auto", False, False, True),      # pods on other hosts: each role behind its terminator
    ("trainjob", "auto", False, False, True),
    ("trainjob", "auto", True, False, False),    # the ambient mesh's mTLS
    ("trainjob", "on", True, False, True),       # asked for under the mesh too
    ("jobset", "off", False, False, False),
    ("paddlejob", "auto", False, False, False),  # paddle-operator's pods cannot carry a terminator
])
def test_auto_resolves_per_backend(backend, mode, mesh, compose, on):
    assert tls.tls_on(config(backend, mode, mesh), compose=compose) is on


@pytest.mark.parametrize("backend, why", [("local", "loopback"), ("paddlejob", "POD_IP itself")])
def test_tls_on_where_it_cannot_run_is_refused_in_one_line(backend, why):
    with pytest.raises(ConfigError, match=rf"ps\.tls.*auto or off for this backend.*{why}") as err:
        tls.tls_on(config(backend, "on"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("backend, mode, mesh, compose, warned", [
    ("jobset", "off", False, False, True), ("paddlejob", "auto", False, False, True),  # pods talk in the clear
    ("local", "off", False, True, True),                                               # a compose job without TLS
    ("local", "off", False, False, False), ("jobset", "auto", True, False, False),     # loopback; the mesh's mTLS
    ("local", "auto", False, True, False), ("jobset", "auto", False, False, False),    # TLS
])
def test_plaintext_across_hosts_is_said(backend, mode, mesh, compose, warned):
    warning = tls.plaintext_warning(config(backend, mode, mesh), compose=compose)
    assert (warning is not None) is warned
    if warned:
        assert f"ps.tls={mode}" in warning and "plaintext" in warning


# -- certificates -------------------------------------------------------------------------------------------------

def test_each_role_gets_a_certificate_of_the_jobs_own_ca_naming_its_host():
    issued = issue_job_credentials("job-a", {"ps-0": ["ps-0.job-a.ns.svc"], "worker-0": []})
    assert len({c.ca for c in issued.values()}) == 1
    for role, credentials in issued.items():
        assert verifies(credentials.cert, credentials.ca)
        cert = x509.load_pem_x509_certificate(credentials.cert)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
        assert role in names
        assert cert.subject.get_attributes_for_oid(x509.oid.NameOID.ORGANIZATION_NAME)[0].value == "job-a"
    assert "ps-0.job-a.ns.svc" in x509.load_pem_x509_certificate(issued["ps-0"].cert).extensions \
        .get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert len({c.key for c in issued.values()}) == 2


def test_a_certificate_of_one_job_is_not_valid_for_another():
    job_a = issue_job_credentials("job", {"ps-0": []})["ps-0"]
    job_b = issue_job_credentials("job", {"ps-0": []})["ps-0"]  # same names, a new CA: another job
    assert job_a.ca != job_b.ca
    assert not verifies(job_a.cert, job_b.ca) and not verifies(job_b.cert, job_a.ca)


def test_the_ca_signs_nothing_but_role_certificates():
    ca = x509.load_pem_x509_certificate(issue_job_credentials("job", {"ps-0": []})["ps-0"].ca)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0


# -- the address rewrite and the terminator's configuration -------------------------------------------------------

def test_only_the_store_moves_to_loopback_and_every_role_keeps_its_network_endpoint():
    layout = tls.store_on_loopback(HOSTS)
    assert (layout.server_endpoints, layout.worker_endpoints) == (HOSTS.server_endpoints, HOSTS.worker_endpoints)
    assert layout.gloo_endpoint == "127.0.0.1:36118" and HOSTS.gloo_endpoint == "ps-0:36018"
    for i in range(HOSTS.servers):
        env = role_env(layout, Role.SERVER, i)
        assert f"{env['POD_IP']}:{env['PADDLE_PORT']}" == env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")[i]


def test_only_the_store_goes_through_a_terminator():
    """Server 0 terminates TLS on the store's network port and forwards to the store on loopback; every other role
    dials the store through its own loopback port. brpc's ports carry their own TLS: no tunnel."""
    server0 = [(t.name, t.accept, t.connect, t.client) for t in tls.tunnels(HOSTS, Role.SERVER, 0)]
    assert server0 == [("store-in", "0.0.0.0:36018", "127.0.0.1:36118", False)]
    for role, index in ((Role.SERVER, 1), (Role.WORKER, 0), (Role.WORKER, 2)):
        assert [(t.name, t.accept, t.connect, t.client, t.peer) for t in tls.tunnels(HOSTS, role, index)] == [
            ("store", "127.0.0.1:36118", "ps-0:36018", True, "ps-0")]


def binds(conf: str) -> list[str]:
    """Where the HAProxy configuration ``conf`` listens."""
    return [line.split()[1] for line in conf.splitlines() if line.strip().startswith("bind ")]


def test_the_terminator_verifies_the_peer_against_the_jobs_ca_and_checks_the_dialled_name():
    text = tls.terminator_config(tls.tunnels(HOSTS, Role.WORKER, 0), "worker-0.pem", {"ps-0": "10.0.0.7"}, "/tls")
    lines = [line.strip() for line in text.splitlines()]
    assert ("server ps-0 10.0.0.7:36018 ssl crt /tls/worker-0.pem ca-file /tls/ca.crt verify required "
            "verifyhost ps-0 ssl-min-ver TLSv1.2") in lines  # dialled at its address, its name checked
    by_name = tls.terminator_config(tls.tunnels(HOSTS, Role.WORKER, 0), "worker-0.pem", tls_dir="/tls")
    assert "server ps-0 ps-0:36018 ssl" in by_name  # no address given: by name
    assert "mode tcp" in lines and "nbthread 1" in lines
    assert binds(text) == ["127.0.0.1:36118"]
    server_tunnels = tls.tunnels(HOSTS, Role.SERVER, 0)
    server = tls.terminator_config(server_tunnels, "server-0.pem", tls_dir="/tls")
    assert ("bind 0.0.0.0:36018 ssl crt /tls/server-0.pem ca-file /tls/ca.crt verify required ssl-min-ver TLSv1.2"
            in [line.strip() for line in server.splitlines()])  # a client without the job's certificate: refused
    assert binds(server) == ["0.0.0.0:36018"]
    assert tls.listen_endpoints(server_tunnels) == ["127.0.0.1:36018"]  # dialled on this host


def test_role_files_hold_each_roles_own_key_and_one_ca():
    files = tls.role_files(HOSTS)
    assert set(files) == {(Role.SERVER, 0), (Role.SERVER, 1), (Role.WORKER, 0), (Role.WORKER, 1), (Role.WORKER, 2)}
    assert len({f[tls.CA_FILE] for f in files.values()}) == 1
    pems = [f[tls.pem_name(*role)] for role, f in files.items()]
    assert len(set(pems)) == len(files) and all("PRIVATE KEY" in pem and "CERTIFICATE" in pem for pem in pems)


def test_a_role_configures_its_tls_from_its_env(tmp_path):
    library = tmp_path / "libbrpc_tls.so"
    library.touch()
    resolved = []

    def resolve(host):
        resolved.append(host)
        return "10.0.0.1"

    def plan(role, index):
        resolved.clear()
        return tls.plan({**role_env(HOSTS, role, index), brpc_tls.LIBRARY_ENV: str(library)}, resolve)

    role_plan = plan(Role.WORKER, 2)  # what a launcher gives worker 2
    conf, env = role_plan.conf, role_plan.env
    assert resolved == ["ps-0"]  # the store's host only
    assert f"ssl crt {tls.TLS_DIR}/worker-2.pem" in conf and "server ps-0 10.0.0.1:36018 ssl" in conf
    assert role_plan.listens == binds(conf) == ["127.0.0.1:36118"]
    assert env["POD_IP"] == "worker-2" and env["PADDLE_PSERVERS_IP_PORT_LIST"] == "ps-0:36000,ps-1:36000"
    assert env["PADDLE_GLOO_HTTP_ENDPOINT"] == "127.0.0.1:36118"
    assert env["LD_PRELOAD"] == str(library)  # brpc's TLS, with the role's own files
    assert (env[brpc_tls.PEM_ENV], env[brpc_tls.CA_ENV]) == (f"{tls.TLS_DIR}/worker-2.pem", f"{tls.TLS_DIR}/ca.crt")
    server0 = plan(Role.SERVER, 0)
    assert resolved == [] and server0.listens == ["127.0.0.1:36018"]  # it serves the store: dials no one
    assert "server local 127.0.0.1:36118" in server0.conf
    assert server0.env["POD_IP"] == "ps-0" and server0.env["PADDLE_PORT"] == "36000"


def test_a_role_without_the_brpc_tls_library_fails_in_one_line_naming_the_fix(tmp_path):
    environ = {**role_env(HOSTS, Role.SERVER, 1), brpc_tls.LIBRARY_ENV: str(tmp_path / "missing.so")}
    with pytest.raises(FileNotFoundError) as error:
        tls.plan(environ, lambda host: "10.0.0.1")
    message = str(error.value)
    assert "\n" not in message and "missing.so" in message and "python -m components.ps.brpc_tls" in message


# -- a real terminator pair ------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_role(directory: Path, credentials, tunnels: list[tls.Tunnel]) -> Path:
    directory.mkdir()
    (directory / "role.pem").write_bytes(credentials.cert + credentials.key)
    (directory / tls.CA_FILE).write_bytes(credentials.ca)
    conf = directory / "haproxy.cfg"
    conf.write_text(tls.terminator_config(tunnels, "role.pem", tls_dir=str(directory)))
    return conf


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="HAProxy is not installed (apt-get install haproxy)")
def test_a_terminator_pair_carries_the_jobs_connections_and_refuses_a_client_without_its_certificate(tmp_path):
    backend, network, local = free_port(), free_port(), free_port()
    echo = socket.create_server(("127.0.0.1", backend))
    served = []

    def serve():
        while True:
            try:
                conn, _ = echo.accept()
            except OSError:
                return
            with conn:
                data = conn.recv(64)
                served.append(data)
                conn.sendall(data.upper())

    threading.Thread(target=serve, daemon=True).start()
    issued = issue_job_credentials("job", {"localhost": []})["localhost"]
    server_conf = write_role(tmp_path / "server", issued, [
        tls.Tunnel("in", f"127.0.0.1:{network}", f"127.0.0.1:{backend}", client=False)])
    client_conf = write_role(tmp_path / "client", issued, [
        tls.Tunnel("out", f"127.0.0.1:{local}", f"127.0.0.1:{network}", client=True, peer="localhost")])
    procs = [subprocess.Popen(["haproxy", "-db", "-f", str(c)], stderr=subprocess.DEVNULL)
             for c in (server_conf, client_conf)]
    try:
        wait_until_listening([f"127.0.0.1:{network}", f"127.0.0.1:{local}"], 10, hold_s=0)
        with socket.create_connection(("127.0.0.1", local), timeout=5) as conn:
            conn.sendall(b"ps_pull")
            assert conn.recv(64) == b"PS_PULL"
        assert endpoint_accepts(f"127.0.0.1:{local}")  # the tunnel holds a connection to a listening peer

        # A TLS client with a certificate of another job: the handshake fails, nothing reaches the backend.
        other = issue_job_credentials("job", {"localhost": []})["localhost"]
        stranger = tmp_path / "stranger"
        stranger.mkdir()
        (stranger / "c.pem").write_bytes(other.cert)
        (stranger / "k.pem").write_bytes(other.key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.load_cert_chain(stranger / "c.pem", stranger / "k.pem")
        for ctx in (context, ssl._create_unverified_context()):  # another job's certificate; none at all
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                with socket.create_connection(("127.0.0.1", network), timeout=5) as raw:
                    with ctx.wrap_socket(raw, server_hostname="localhost") as conn:
                        conn.sendall(b"PS_STOP_SERVER")
                        if conn.recv(64) == b"":
                            raise ConnectionError("closed")
        with socket.create_connection(("127.0.0.1", network), timeout=5) as raw:  # plaintext: never forwarded
            raw.sendall(b"PS_STOP_SERVER\r\n\r\n")
            raw.settimeout(5)
            try:
                assert raw.recv(64) != b"PS_STOP_SERVER"  # a TLS alert, the close, or a reset
            except ConnectionResetError:
                pass
        time.sleep(0.5)  # what the terminator forwarded, the backend has read
        assert [data for data in served if data] == [b"ps_pull"]  # the job's request only; empty: probes' closes
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        echo.close()
