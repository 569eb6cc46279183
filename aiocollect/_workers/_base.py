"""The interface every worker backend implements; the collectors use nothing else."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from .._shm import SharedBlock

__all__ = ["WorkerHandle"]


class WorkerHandle(ABC):
    """One worker: started once, commanded with small tuples, stopped within a deadline.

    Messages and commands are the tuples documented in ``_worker_main``. ``receive`` returns
    ``("exited", exitcode)`` once the worker is gone and every message it sent was read, so a
    crash is reported the same way by every backend.
    """

    worker_id: int

    @property
    @abstractmethod
    def pid(self) -> int | None:
        """Process id of the worker (or ``None`` before start)."""

    @abstractmethod
    async def start(self, config_bytes: bytes, weights: SharedBlock | None) -> None:
        """Start the worker with its cloudpickled `WorkerConfig` and the shared weight block."""

    @abstractmethod
    def send(self, message: tuple[Any, ...]) -> None:
        """Send one command (never blocks for long: commands are small)."""

    @abstractmethod
    def send_fd(self, fd: int) -> None:
        """Hand the worker a file descriptor (after a command that announces one)."""

    @abstractmethod
    def receive_nowait(self) -> tuple[Any, ...] | None:
        """Return a message that has already arrived, or ``None``."""

    @abstractmethod
    async def receive(self) -> tuple[Any, ...]:
        """Wait for the worker's next message without blocking the event loop."""

    @abstractmethod
    async def stop(self, timeout: float) -> None:
        """Close, then terminate, then kill; free every resource. Idempotent."""

    @abstractmethod
    def kill_now(self) -> None:
        """Stop at once, synchronously (for garbage collection of an unclosed collector)."""
