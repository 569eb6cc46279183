"""Ray itself, shared by the Ray transport and the Ray launcher: one lease-counted instance per process."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["acquire_ray", "check_ray_options", "release_ray"]


def check_ray_options(target: Any, options: Mapping[str, Any]) -> None:
    """Ray's own check of actor (or task) options, before anything starts: a typo is an error now."""
    import ray

    try:
        ray.remote(target).options(**options)
    except (ValueError, TypeError) as exc:
        kind = "actor" if isinstance(target, type) else "task"
        raise ValueError(f"remote_configs {dict(options)} are not valid Ray {kind} options: {exc}") from None


# -- Ray itself: started once per process by the first collector that needs it ------------------
_LEASE_LOCK = threading.Lock()
_LEASES = 0  # collectors using the Ray instance that aiocollect started or connected to


def acquire_ray(init_config: dict[str, Any]) -> bool:
    """Make sure Ray is up; True if this lease must be released (aiocollect started it)."""
    global _LEASES
    import ray

    with _LEASE_LOCK:
        if _LEASES == 0 and ray.is_initialized():
            return False  # the user's Ray: use it, never shut it down
        if _LEASES == 0:
            config = {"include_dashboard": False, "configure_logging": False, **init_config}
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(**config)
        _LEASES += 1
        return True


def release_ray() -> None:
    """Give back a lease of `acquire_ray`; the last one shuts down the Ray that aiocollect started."""
    global _LEASES
    import ray

    with _LEASE_LOCK:
        _LEASES -= 1
        if _LEASES == 0 and ray.is_initialized():
            ray.shutdown()
