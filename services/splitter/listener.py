"""LISTEN on channel `tasks` (minions/db/listen.py) and wake the workers.

A notification is only a wake-up: the workers then sweep for unsplit tasks, so a notification lost
while the connection was down costs nothing but latency. That is also why every (re)LISTEN wakes
the workers once.
"""

from __future__ import annotations

import asyncio

from minions.db.listen import Listener

CHANNEL = "tasks"


class Wakeup:
    """Wakes every worker: each waits on its own event and clears it before it sweeps, so a wake-up
    that arrives during a sweep leads to one more sweep, never to none."""

    def __init__(self) -> None:
        self._events: list[asyncio.Event] = []

    def subscribe(self) -> asyncio.Event:
        event = asyncio.Event()
        event.set()  # sweep once at start
        self._events.append(event)
        return event

    def set(self) -> None:
        for event in self._events:
            event.set()


def task_listener(database_url: str, wakeup: Wakeup, *, probe_interval_s: float) -> Listener:
    """Every notification, and every (re)LISTEN, wakes the workers; the payload is not needed."""
    return Listener(database_url, CHANNEL, lambda _payload: wakeup.set(), catch_up=wakeup.set,
                    probe_interval_s=probe_interval_s)
