"""Where a PS process listens: its gloo transport on the interface that holds its own host's address, its store on
that host (never every interface), and a local job on loopback unless told otherwise."""

import pytest
from omegaconf import OmegaConf

from components.config import ConfigError, CtrConfig, from_dict
from components.config_rules import validate
from components.ps.network import interface_of, resolved_own_host
from components.resolve.step import check_local_host


def test_the_interface_of_a_host_is_the_one_holding_its_address():
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("localhost") == "lo"
    assert interface_of("127.0.0.2") == "lo"  # all of 127/8 is the loopback interface's
    assert interface_of("192.0.2.123") is None  # TEST-NET-1: held by no interface of this machine
    assert interface_of("no-such-host.invalid") is None


def test_a_host_that_does_not_resolve_fails_naming_it_rather_than_binding_every_interface():
    assert resolved_own_host("localhost", timeout_s=0) == "127.0.0.1"
    with pytest.raises(OSError, match="'no-such-host.invalid' .* did not resolve within 0s.*not bound to every"):
        resolved_own_host("no-such-host.invalid", timeout_s=0)


def test_a_process_waits_for_its_own_host_to_resolve_before_paddle_starts_its_server(monkeypatch, tmp_path):
    """A brpc server whose own name does not resolve yet segfaults inside Paddle; the process waits for the name
    instead (a container's name reaches the network's DNS a moment after it starts), then fails naming POD_IP."""
    import socket

    from components.ps import network

    lookups, real_lookup = [], socket.gethostbyname

    def resolve_on_third_try(host):
        lookups.append(host)
        if len(lookups) < 3:
            raise socket.gaierror(-2, "Name or service not known")
        return "127.0.0.1"

    monkeypatch.chdir(tmp_path)  # Paddle's gloo store module opens http.log in the working directory on import
    monkeypatch.setenv("POD_IP", "ps-0")
    monkeypatch.delenv("PADDLE_GLOO_HTTP_ENDPOINT", raising=False)
    monkeypatch.setattr(network.socket, "gethostbyname", resolve_on_third_try)
    monkeypatch.setattr(network.time, "sleep", lambda s: None)
    network.bind_to_own_host()
    assert lookups[:3] == ["ps-0"] * 3
    monkeypatch.setattr(network, "RESOLVE_TIMEOUT_S", 0.0)
    monkeypatch.setenv("POD_IP", "no-such-host.invalid")
    monkeypatch.setattr(network.socket, "gethostbyname", real_lookup)
    with pytest.raises(OSError, match="this process's host 'no-such-host.invalid' .POD_IP. did not resolve"):
        network.bind_to_own_host()


def _local(*overrides):
    cfg = from_dict(OmegaConf.merge(OmegaConf.structured(CtrConfig), OmegaConf.from_dotlist(list(overrides))))
    validate(cfg)
    return cfg


def test_a_local_job_listens_on_loopback_unless_an_external_bind_is_allowed():
    assert check_local_host(_local("ps.host=127.0.0.1")) is None
    assert check_local_host(_local("ps.host=localhost")) is None
    with pytest.raises(ConfigError, match=r"'ps.host' has value '0.0.0.0'; allowed: a loopback address .* unless "
                                          r"ps.allow_external_bind=true. every role's plaintext PS"):
        check_local_host(_local("ps.host=0.0.0.0"))
    warning = check_local_host(_local("ps.host=0.0.0.0", "ps.allow_external_bind=true"))
    assert warning.startswith("warning: ps.host=0.0.0.0: every role's plaintext PS") and "listen on 0.0.0.0" in warning
