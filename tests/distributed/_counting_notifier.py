"""A `Notifier` that counts, for each wait naming a node, how often it was woken by anything else.

A wait checks its predicate once on entry and once per wake-up. One that names a node
(``key=w``) should be woken by that node's notifications (`notify(w)`) only: if each node's
event woke every node's waiter (a `notify_all`, or a wait that names no node), N nodes would
cost N²/2 wake-ups. Install it with ``monkeypatch.setattr(<transport module>, "Notifier",
CountingNotifier)`` before the collector is built.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from typing import ClassVar

from aiocollect._core._notify import Notifier


class CountingNotifier(Notifier):
    #: ``(key, checks, allowed)`` per finished wait that named a key; ``allowed`` is 1 plus
    #: the notifications for that key made while it waited. A `notify_all` while a node's
    #: start or stop waits is a wake-up of every node too, and is not allowed for.
    waits: ClassVar[list[tuple[Hashable, int, int]]] = []

    def __init__(self) -> None:
        super().__init__()
        self.sent: Counter[Hashable] = Counter()  # notifications per key; None: notify_all

    def notify(self, key: Hashable) -> None:
        with self.lock:  # counted before the wake-up, so a woken wait always sees its cause
            self.sent[key] += 1
        super().notify(key)

    def notify_all(self) -> None:
        with self.lock:
            self.sent[None] += 1
        super().notify_all()

    async def wait_until(self, predicate: Callable[[], bool], key: Hashable = None) -> float:
        if key is None:
            return await super().wait_until(predicate)
        checks = 0
        with self.lock:
            before = self.sent[key]

        def counted() -> bool:
            nonlocal checks
            checks += 1
            return predicate()

        try:
            return await super().wait_until(counted, key=key)
        finally:
            with self.lock:
                allowed = 1 + self.sent[key] - before
            self.waits.append((key, checks, allowed))

    @classmethod
    def woken_by_others(cls) -> list[tuple[Hashable, int, int]]:
        """The waits that checked their predicate more often than their own node's notifications allow."""
        return [w for w in cls.waits if w[1] > w[2]]
