"""Ports for the servers the demo and the test harness start: free on every interface, out of
the kernel's range for outgoing connections, and never handed out twice by the choosers of one
machine, so that none can be taken between the choice and the server's bind."""

from __future__ import annotations

import multiprocessing
import socket

import pytest

from server.demo.ports import LISTEN_PORTS_FROM, ephemeral_ports_start, free_ports, hold_port
from server.listen import bind


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


def _choose(count: int) -> list[int]:
    return [port for _ in range(count // 50) for port in free_ports(50)]


def test_choosers_in_several_processes_never_hand_out_one_port_twice() -> None:
    # test workers and demos choose at once, each handing ports to servers that bind them
    # seconds later; 800 random ports among about 12,000 would meet about 25 times
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        chosen = pool.map(_choose, [200] * 4)
    given = [port for ports in chosen for port in ports]
    assert len(given) == 800
    assert len(set(given)) == 800, sorted(p for p in set(given) if given.count(p) > 1)


def test_a_held_port_is_chosen_by_no_one_and_bound_by_no_server_until_closed() -> None:
    (port,) = free_ports(1)
    held = hold_port("127.0.0.1", port)
    try:
        for _ in range(10):
            assert port not in free_ports(40)
        with pytest.raises(SystemExit, match=f"cannot listen on 127.0.0.1:{port}"):
            bind("127.0.0.1", port)  # the daemon's own bind, with SO_REUSEADDR
        with pytest.raises(OSError, match="in use"):
            hold_port("127.0.0.1", port)  # a second demo given the same --port
    finally:
        held.close()
    for sock in bind("127.0.0.1", port):  # free again for the server meant to have it
        sock.close()
