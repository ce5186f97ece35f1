"""Which interface a PS process's gloo transport binds: the one that holds its own host's address."""

from components.ps.network import interface_of


def test_the_interface_of_a_host_is_the_one_holding_its_address():
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("localhost") == "lo"
    assert interface_of("127.0.0.2") == "lo"  # all of 127/8 is the loopback interface's
    assert interface_of("192.0.2.123") is None  # TEST-NET-1: held by no interface of this machine
    assert interface_of("no-such-host.invalid") is None
