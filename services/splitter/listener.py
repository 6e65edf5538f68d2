"""LISTEN on channel `tasks` (minions/db/listen.py) and wake the workers.

A notification names a task (a new one, a split that ended, a close that could not decide its
task's end): every worker sweeps for unsplit tasks, and one of them looks whether the named tasks
may have ended (sql/schema/04_tasks.sql). A notification is still only a wake-up: a lost one
costs latency, never work, since the workers sweep every open task on start, after every (re)LISTEN
and every sweep interval.
"""

from __future__ import annotations

import asyncio

from minions.db.listen import Listener

CHANNEL = "tasks"


class Wakeup:
    """Wakes every worker: each waits on its own event and clears it before it looks, so a wake-up
    that arrives while it works leads to one more look, never to none. The tasks named gather here
    until a worker takes them all: settling is one worker's job, splitting everyone's."""

    def __init__(self) -> None:
        self._events: list[asyncio.Event] = []
        self._named: set[int] = set()
        # Asks for a sweep of every open task, each worker once: bumped by every (re)LISTEN (what
        # was notified meanwhile is lost) and by a notification that names no task.
        self.sweeps_asked = 0

    def subscribe(self) -> asyncio.Event:
        event = asyncio.Event()
        event.set()  # sweep once at start
        self._events.append(event)
        return event

    def notified(self, payload: str) -> None:
        try:
            self._named.add(int(payload))
        except ValueError:  # an operator's bare `NOTIFY tasks`, say: look at everything
            self.sweeps_asked += 1
        self._wake()

    def caught_up(self) -> None:
        self.sweeps_asked += 1
        self._wake()

    def take_named(self) -> list[int]:
        """The tasks named since the last take, in id order; a worker that takes them settles them."""
        named, self._named = sorted(self._named), set()
        return named

    def _wake(self) -> None:
        for event in self._events:
            event.set()


def task_listener(database_url: str, wakeup: Wakeup, *, probe_interval_s: float) -> Listener:
    return Listener(database_url, CHANNEL, wakeup.notified, catch_up=wakeup.caught_up,
                    probe_interval_s=probe_interval_s)
