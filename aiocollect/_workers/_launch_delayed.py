"""``launcher="submitit_delayed"``: nodes that `submitit_delayed_launcher` submitted before main ran.

The decorator submits the main function as a job (`delayed_main`), which picks its address
and port, writes them to a rendezvous file and exports them to the collector in
``AIOCOLLECT_SUBMITIT_DELAYED``; then the decorator submits the node jobs (`delayed_node`),
which connect there. Inside main, a collector with ``launcher="submitit_delayed"`` starts
nothing: it reads that context, checks it matches (framework, backend, number of nodes)
and waits for the nodes, as with ``launcher="external"``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Callable, Mapping
from typing import Any

from ._ports import held_port

__all__ = ["ENV", "apply_delayed_context", "check_delayed_node_count", "delayed_main", "delayed_node"]

ENV = "AIOCOLLECT_SUBMITIT_DELAYED"


def apply_delayed_context(out: dict[str, Any], framework: str, backend: str | None = None) -> None:
    """Point a transport's options (``launcher="submitit_delayed"``) at the nodes the decorator launched."""
    raw = os.environ.get(ENV)
    if raw is None:
        raise ValueError(
            "launcher='submitit_delayed' connects to the node jobs of submitit_delayed_launcher, and this "
            "process was not started by it; decorate your main function with submitit_delayed_launcher(...) "
            "or use launcher='submitit'"
        )
    ctx = json.loads(raw)
    if ctx["framework"] != framework:
        raise ValueError(
            f"submitit_delayed_launcher(framework={ctx['framework']!r}) launched nodes for another collector; "
            f"pass framework={framework!r} to use them from this one"
        )
    if backend is not None and ctx["backend"] != backend:
        raise ValueError(
            f"submitit_delayed_launcher(backend={ctx['backend']!r}) launched the nodes, but this collector has "
            f"backend={backend!r}; make them the same"
        )
    for key, value in (("tcp_port", ctx["port"]), ("master_addr", ctx["addr"])):
        if out.get(key) not in (None, value):
            raise ValueError(
                f"{key}={out[key]!r} differs from the {value!r} that submitit_delayed_launcher gave its nodes; "
                f"leave {key} unset with launcher='submitit_delayed'"
            )
    out["tcp_port"], out["master_addr"], out["delayed"] = ctx["port"], ctx["addr"], ctx


def check_delayed_node_count(options: Mapping[str, Any], num_workers: int) -> None:
    """The collector has as many nodes as the decorator launched jobs."""
    ctx = options.get("delayed")
    if ctx is not None and ctx["num_jobs"] != num_workers:
        raise ValueError(
            f"submitit_delayed_launcher launched {ctx['num_jobs']} node jobs, but this collector has {num_workers} "
            "nodes; make num_jobs and the number of nodes equal"
        )


def delayed_main(
    main: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    context: dict[str, Any],
    rendezvous: str,
    local: bool,
) -> Any:
    """The main job: publish where the trainer listens, then run the user's main function."""
    addr = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if local else socket.gethostbyname(socket.gethostname()))
    # Chosen where the trainer runs, so it is free there, and held until main's collector
    # listens on it: the node jobs connect there, whenever main gets to its collector.
    with held_port(addr, context["port"]) as port:
        ctx = {**context, "addr": addr, "port": port, "session": secrets.token_hex(4)}
        tmp = f"{rendezvous}.tmp"
        with open(tmp, "w") as f:
            json.dump(ctx, f)
        os.replace(tmp, rendezvous)  # the decorator never reads a half-written file
        os.environ[ENV] = json.dumps(ctx)
        return main(*args, **kwargs)


def delayed_node(ctx: dict[str, Any], rank: int, timeout: float) -> None:
    """A node job: join the trainer of ``ctx`` as node ``rank`` and serve it until it closes."""
    world = ctx["num_jobs"] + 1
    if ctx["framework"] == "distributed":
        from ._distributed_node import node_main

        node_main(ctx["addr"], ctx["port"], rank, None, timeout, world)
    else:
        from ._rpc_node import TENSORPIPE_DEFAULTS, rpc_node_main

        # The trainer sets its RPC group counter to 0 for these nodes (see RpcTransport._open).
        rpc_node_main(ctx["addr"], ctx["port"], rank, world, timeout, dict(TENSORPIPE_DEFAULTS), 0, ctx["session"])
