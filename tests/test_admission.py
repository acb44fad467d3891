"""The gate before admission (deadline, room for waiting connections) and the shared places."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import pytest

from imaging_ai import admission
from imaging_ai.admission import Gate, Places


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made: list[tuple[socket.socket, socket.socket]] = []
    yield made
    for ours, theirs in made:
        ours.close()
        theirs.close()


def _pair(pairs: list[tuple[socket.socket, socket.socket]]) -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    theirs.settimeout(2)
    pairs.append((ours, theirs))
    return ours, theirs


def test_places_hold_across_processes_rows_and_a_cleared_row_gives_them_back() -> None:
    places = Places(2)
    first, second = places.bind(0), places.bind(1)
    assert first.take_admitted(2) and second.take_admitted(2)
    assert not first.take_admitted(2)  # the limit is the daemon's, not the row's
    second.clear_row()  # its process died with its sockets
    assert first.take_admitted(2)
    assert places.counts() == (0, 2)


def test_a_connection_not_admitted_by_its_deadline_is_shut_down(pairs: list) -> None:
    gate = Gate(Places(), 4, 0.3)
    ours, theirs = _pair(pairs)
    start = time.monotonic()
    ticket = gate.enter(ours.fileno(), "127.0.0.1")
    assert ticket is not None
    assert theirs.recv(1) == b""  # the transport is closed, no A-ABORT (PS3.8 AA-2)
    assert 0.25 < time.monotonic() - start < 1.5
    assert "no association within 0.3 s" in ticket.closed
    assert not ticket.settle()
    assert gate.places.counts() == (0, 0)
    gate.stop()


def test_an_admitted_connection_outlives_the_deadline(pairs: list) -> None:
    gate = Gate(Places(), 4, 0.2)
    ours, theirs = _pair(pairs)
    ticket = gate.enter(ours.fileno(), "127.0.0.1")
    assert ticket is not None and ticket.settle()
    theirs.settimeout(0.5)
    with pytest.raises(TimeoutError):
        theirs.recv(1)
    gate.leave(ticket)
    assert gate.places.counts() == (0, 0)
    gate.stop()


def test_a_new_connection_takes_the_place_of_the_one_waiting_longest(pairs: list) -> None:
    gate = Gate(Places(), 2, 30.0)
    tickets = []
    for _ in range(3):
        ours, _ = _pair(pairs)
        tickets.append(gate.enter(ours.fileno(), "127.0.0.1"))
    assert pairs[0][1].recv(1) == b""
    assert "make room" in tickets[0].closed and not tickets[1].closed
    assert gate.places.counts() == (2, 0)
    for ticket in tickets:
        assert ticket is not None
        gate.leave(ticket)
    assert gate.places.counts() == (0, 0)
    gate.stop()


def test_no_room_and_none_of_this_process_waiting_refuses_the_new_one(pairs: list) -> None:
    places = Places(2)
    busy, idle = Gate(places.bind(0), 1, 30.0), Gate(places.bind(1), 1, 30.0)
    assert busy.enter(_pair(pairs)[0].fileno(), "127.0.0.1") is not None
    assert idle.enter(_pair(pairs)[0].fileno(), "127.0.0.1") is None
    assert places.counts() == (1, 0)
    busy.stop()
    idle.stop()


def test_a_flood_of_closings_is_logged_as_counts_not_line_by_line(
    pairs: list, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "_LOG_EVERY_S", 0.3)
    gate = Gate(Places(), 1, 30.0)
    with caplog.at_level(logging.WARNING, logger="imaging_ai.admission"):
        for _ in range(20):
            gate.enter(_pair(pairs)[0].fileno(), "127.0.0.1")
        time.sleep(0.6)  # the deadline thread logs what was counted meanwhile
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "1 closed to make room" in lines[0] and "18 closed to make room" in lines[1]
    gate.stop()
