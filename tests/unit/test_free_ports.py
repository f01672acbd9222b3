"""Ports for the servers the demo and the test harness start: free on every interface, and out
of the kernel's range for outgoing connections, so that none can be taken between the choice
and the server's bind."""

from __future__ import annotations

import socket

from server.demo.processes import LISTEN_PORTS_FROM, ephemeral_ports_start, free_ports


def test_ports_are_distinct_free_everywhere_and_below_the_ephemeral_range() -> None:
    start = ephemeral_ports_start()
    assert start > LISTEN_PORTS_FROM, f"this machine's ephemeral range starts at {start}"
    chosen = free_ports(16)
    assert len(set(chosen)) == 16
    assert all(LISTEN_PORTS_FROM <= port < start for port in chosen), chosen
    for port in chosen:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", port))  # raises if the choice left it held or it was not free


def test_a_port_in_use_is_never_chosen() -> None:
    held = []
    try:
        for port in free_ports(40):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", port))
            sock.listen()
            held.append(sock)
        taken = {sock.getsockname()[1] for sock in held}
        for _ in range(20):
            assert not taken & set(free_ports(40))
    finally:
        for sock in held:
            sock.close()


def test_two_choices_differ() -> None:
    # random among about 12,000 ports, not the kernel's next ones: two processes choosing at
    # once rarely pick the same
    assert free_ports(16) != free_ports(16)


def test_the_harness_never_hands_out_a_port_twice_in_a_row() -> None:
    # a daemon given a port may not have bound it when the next one is chosen
    from harness.services import _free_ports, free_port

    given = [free_port() for _ in range(300)] + _free_ports(200)
    assert len(set(given)) == 500
