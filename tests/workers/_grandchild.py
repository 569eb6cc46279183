"""What a worker's env runs in a process of its own: imports nothing heavy, so it starts fast."""

from __future__ import annotations

import signal
import threading
from typing import Any


def run_forever(ready: Any) -> None:
    """Never end on its own: deaf to SIGTERM and SIGINT, blind to its parent's death."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ready.set()
    threading.Event().wait()
