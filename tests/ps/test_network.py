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


def test_the_names_handed_to_brpc_and_gloo_become_addresses_resolved_once_waiting_for_late_ones(monkeypatch):
    """brpc looks names up again itself and a failed lookup segfaults inside Paddle: a process hands it addresses,
    resolved in Python, where a name not yet published is waited for, then fails naming the variable."""
    from components.ps import network

    addresses = {"ps-0": "10.0.0.2", "ps-1": "10.0.0.3", "worker-0": "10.0.0.4"}
    lookups = []

    def resolve_on_second_try(host):
        lookups.append(host)
        if lookups.count(host) < 2:
            raise OSError(-2, "Name or service not known")
        return addresses[host]

    monkeypatch.setattr(network.socket, "gethostbyname", resolve_on_second_try)
    monkeypatch.setattr(network.time, "sleep", lambda s: None)
    common = {"PADDLE_PSERVERS_IP_PORT_LIST": "ps-0:36000,ps-1:36000", "PADDLE_GLOO_HTTP_ENDPOINT": "ps-0:36018",
              "PADDLE_TRAINER_ENDPOINTS": "worker-0:36000", "PADDLE_PORT": "36000"}
    server = dict(common, TRAINING_ROLE="PSERVER", POD_IP="ps-1")
    network.pin_addresses(server, timeout_s=60)
    # A server's own entry stays equal to POD_IP:PADDLE_PORT (Paddle finds its index so); it waits for no peer.
    assert server["POD_IP"] == "10.0.0.3"
    assert server["PADDLE_PSERVERS_IP_PORT_LIST"] == "ps-0:36000,10.0.0.3:36000"
    assert server["PADDLE_GLOO_HTTP_ENDPOINT"] == "10.0.0.2:36018"
    assert server["PADDLE_TRAINER_ENDPOINTS"] == "worker-0:36000"
    lookups.clear()
    worker = dict(common, TRAINING_ROLE="TRAINER", POD_IP="worker-0")
    network.pin_addresses(worker, timeout_s=60)
    assert worker["POD_IP"] == "10.0.0.4"
    assert worker["PADDLE_PSERVERS_IP_PORT_LIST"] == "10.0.0.2:36000,10.0.0.3:36000"  # it connects to each
    assert sorted(set(lookups)) == ["ps-0", "ps-1", "worker-0"] and len(lookups) == 6
    local = {"PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:5000,127.0.0.1:5001", "PADDLE_PORT": "5001",
             "POD_IP": "127.0.0.1", "TRAINING_ROLE": "PSERVER"}
    monkeypatch.undo()
    network.pin_addresses(local, timeout_s=0)
    assert local["PADDLE_PSERVERS_IP_PORT_LIST"] == "127.0.0.1:5000,127.0.0.1:5001"
    late = dict(common, TRAINING_ROLE="TRAINER", POD_IP="localhost",
                PADDLE_PSERVERS_IP_PORT_LIST="no-such-host.invalid:36000", PADDLE_GLOO_HTTP_ENDPOINT="localhost:1")
    with pytest.raises(OSError, match="a server's host 'no-such-host.invalid' .PADDLE_PSERVERS_IP_PORT_LIST. did "
                                      "not resolve within 0s"):
        network.pin_addresses(late, timeout_s=0)


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
