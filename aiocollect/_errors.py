"""The aiocollect exception hierarchy: one base class, documented triggers."""

from __future__ import annotations

__all__ = [
    "AiocollectError",
    "BufferClosedError",
    "BufferEmptyError",
    "CollectorClosedError",
    "EnvOutputError",
    "PolicyOutputError",
    "WorkerCrashedError",
    "WorkerError",
    "WouldBlock",
]


class AiocollectError(Exception):
    """Base class of every error aiocollect raises on its own account."""


class CollectorClosedError(AiocollectError):
    """Raised when a collector is used after ``shutdown()``/``aclose()``."""


class WouldBlock(AiocollectError):
    """Raised when a ``*_nowait()`` call would have to wait."""


class BufferClosedError(AiocollectError):
    """Raised when a replay buffer is used after ``aclose()``/``close()``."""


class BufferEmptyError(WouldBlock, LookupError):
    """Raised when a replay buffer holds nothing that can be sampled yet (``sample_nowait()``)."""


class PolicyOutputError(AiocollectError, ValueError):
    """Raised when a policy's output does not match the environment's action spec."""


class EnvOutputError(AiocollectError, ValueError):
    """Raised when an environment returns an entry whose shape differs from the one its spec promises."""


class WorkerError(AiocollectError):
    """Raised when code running in a collector worker (env or policy) raises.

    The worker's original exception is attached as ``__cause__``.

    Attributes:
        worker_id: Index of the worker that failed.
        pid: Process id of the worker (the parent's pid for in-process workers).
        step: The collector step at which the failure happened, or ``None``.
    """

    def __init__(self, worker_id: int, pid: int | None, step: int | None, error: str) -> None:
        self.worker_id = worker_id
        self.pid = pid
        self.step = step
        where = f" at step {step}" if step is not None else ""
        super().__init__(f"worker {worker_id} (pid {pid}) failed{where}: {error}")


class WorkerCrashedError(AiocollectError):
    """Raised when a worker process dies without reporting an error (signal, ``os._exit``).

    Attributes:
        worker_id: Index of the worker that died.
        pid: Its process id.
        exitcode: Its exit code (negative: the signal that killed it).
    """

    def __init__(self, worker_id: int, pid: int | None, exitcode: int | None, *, during_startup: bool = False) -> None:
        self.worker_id = worker_id
        self.pid = pid
        self.exitcode = exitcode
        if exitcode is not None and exitcode < 0:
            import signal

            try:
                how = f"killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
        hint = ""
        if during_startup:
            hint = (
                " during startup; if the main module creates the collector at import time, "
                "guard that code with `if __name__ == \"__main__\":`"
            )
        super().__init__(f"worker {worker_id} (pid {pid}) {how}{hint}")


class _RemoteTraceback(Exception):
    """The worker's formatted traceback, attached as ``__cause__`` (as concurrent.futures does)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.tb}\"\"\""


def worker_error_from_message(worker_id: int, pid: int | None, msg: tuple[object, ...]) -> WorkerError:
    """Build the `WorkerError` for an ``("error", step, payload, text, traceback)`` message."""
    import pickle

    _, step, payload, text, tb = msg
    err = WorkerError(worker_id, pid, step, str(text))  # type: ignore[arg-type]
    original: BaseException | None = None
    if payload is not None:
        try:
            original = pickle.loads(payload)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - fall back to the text form
            original = None
    cause = _RemoteTraceback(str(tb))
    if original is not None:
        original.__cause__ = cause
        err.__cause__ = original
    else:
        err.__cause__ = cause
    return err
