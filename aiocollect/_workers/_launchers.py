"""The launchers by name: who starts a distributed or RPC collector's nodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._launch import Launcher, MpLauncher, SubmititLauncher
from ._launch_ray import RayLauncher

__all__ = ["LAUNCHERS", "make_launcher"]

#: Every launcher; a transport accepts those its nodes can be started with.
LAUNCHERS = ("mp", "submitit", "external", "ray", "submitit_delayed")


def make_launcher(
    options: dict[str, Any], main: Callable[..., None] | None = None, preload: Sequence[str] = ()
) -> Launcher:
    """The launcher named by the transport's ``launcher`` option, starting ``main`` (`node_main`).

    ``preload``: the modules a node imports (a fork server preloads them for local nodes).
    """
    name = options["launcher"]
    if name == "mp":
        return MpLauncher(options["start_method"], main, preload, options["fork_server_in_nodes"])
    if name == "submitit":
        return SubmititLauncher(options["slurm_kwargs"], options["submitit_folder"], main)
    if name == "ray":
        return RayLauncher(options["ray_init_config"], options["remote_configs"], main)
    launcher = Launcher()
    launcher.can_kill = False
    return launcher
