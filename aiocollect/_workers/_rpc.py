"""The torch RPC transport: nodes are members of the trainer's ``torch.distributed.rpc`` group.

The trainer launches the node processes (``"mp"`` or ``"submitit"``), which join its RPC
group (TensorPipe, rendezvous at ``master_addr:tcp_port``); then it hosts a `NodeHost` in
each (``_rpc_node.host_create``) and drives it with ``rpc_async`` calls. A call's
``torch.futures.Future`` is never waited on: its done-callback runs on an RPC thread, queues
the result and wakes the event loop (`RemoteTransport`). A node process that dies fails its
pending calls, and its launcher's sentinel reports it too, whichever comes first.

RPC is process-wide in torch: one RPC group per process, so one `RPCCollector` at a time.
"""

from __future__ import annotations

import importlib.util
import multiprocessing.connection
import secrets
import threading
from collections.abc import Mapping
from typing import Any

from ._distributed_options import check_main_and_times, check_port, master_addr
from ._launch_delayed import apply_delayed_context, check_delayed_node_count
from ._launch_ray import check_ray_launcher_options, check_ray_node_count
from ._launchers import make_launcher
from ._messages import Exited
from ._ports import held_port
from ._prestart import node_preload
from ._remote import Done, RemoteTransport
from ._remote_node import HostSetup
from ._rpc_node import (
    TENSORPIPE_DEFAULTS,
    backend_options,
    host_call,
    host_create,
    host_drop,
    init_rpc_quietly,
    node_exit,
    node_name,
    rpc_node_main,
)
from ._subprocess import START_METHODS, _default_start_method

__all__ = ["RpcTransport", "transport_class"]

_DEFAULT_MAIN = "aiocollect._workers._loop:run_worker"
OPTIONS = {
    "launcher": "mp", "start_method": None, "master_addr": None, "tcp_port": None, "slurm_kwargs": None,
    "submitit_folder": "aiocollect_submitit", "tensorpipe_options": None, "worker_main": _DEFAULT_MAIN,
    "join_timeout": 300.0, "beat_interval": 0.5, "ray_init_config": None, "remote_configs": None,
    "delayed": None,  # set from the environment with launcher="submitit_delayed"
    "fork_server_in_nodes": False,  # set by the distributed collectors (see fork_forkserver)
}  # fmt: skip
LAUNCHERS = ("mp", "submitit", "ray", "submitit_delayed")


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The RPC transport's options, defaults filled in; raises on a bad one, before anything starts."""
    options = {k: v for k, v in options.items() if v is not None}
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise TypeError(f"the rpc backend takes no option {sorted(unknown)[0]!r}; it takes {sorted(OPTIONS)}")
    out = {**OPTIONS, **options}
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed; install a build with distributed support")
    if out["launcher"] not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {', '.join(map(repr, LAUNCHERS))}, got {out['launcher']!r}")
    if out["launcher"] == "submitit":
        if importlib.util.find_spec("submitit") is None:
            raise RuntimeError("launcher='submitit' needs submitit: pip install submitit")
    check_ray_launcher_options(out)
    if out["launcher"] == "submitit_delayed":
        apply_delayed_context(out, "rpc")
    out["slurm_kwargs"] = dict(out["slurm_kwargs"] or {})
    method = out["start_method"] or _default_start_method()
    if method not in START_METHODS:
        raise ValueError(f"start_method must be 'forkserver' or 'spawn' (fork is unsafe with threads), got {method!r}")
    out["start_method"] = method
    out["tcp_port"] = check_port(out["tcp_port"])
    out["master_addr"] = master_addr(out)
    tp = out["tensorpipe_options"] or {}
    if not isinstance(tp, Mapping):
        raise TypeError(f"tensorpipe_options must be a dict of TensorPipeRpcBackendOptions arguments, got {tp!r}")
    owned = sorted(set(tp) & {"init_method", "rpc_timeout"})
    if owned:
        raise ValueError(f"tensorpipe_options sets {owned[0]!r}, which the collector sets (use tcp_port/join_timeout)")
    out["tensorpipe_options"] = {**TENSORPIPE_DEFAULTS, **tp}
    check_main_and_times(out)
    return out


def _outcome(future: Any) -> tuple[Any, BaseException | None]:
    try:
        return future.value(), None
    except BaseException as exc:  # handed to the transport, which reports it
        return None, exc


class RpcTransport(RemoteTransport):
    """Nodes are members of this process's torch RPC group, launched by the trainer."""

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return check_options(options)

    def __init__(self, num_workers: int, options: dict[str, Any], weights_layout: Any) -> None:
        check_ray_node_count(options, num_workers)
        check_delayed_node_count(options, num_workers)
        super().__init__(num_workers, options, weights_layout)
        delayed = options.get("delayed")
        # Nodes launched ahead (submitit_delayed) named themselves after the decorator's session.
        self._session = secrets.token_hex(4) if delayed is None else delayed["session"]
        self._launcher: Any = None
        self._rpc_up = False
        self._hosted = [0] * num_workers

    # -- the engine ----------------------------------------------------------------------------
    def _open(self) -> None:
        import torch.distributed.rpc as rpc

        if rpc.api._is_current_rpc_agent_set():
            raise RuntimeError(
                "torch RPC is already initialized in this process (another RPCCollector, or your own "
                "rpc.init_rpc): torch allows one RPC group per process; close the other one first"
            )
        opts = self.options
        with held_port(opts["master_addr"], opts["tcp_port"]) as port:
            self._open_group(port)  # the port stays ours until the group's store listens there

    def _open_group(self, port: int) -> None:
        import torch.distributed.rpc as rpc

        opts, n = self.options, self.num_workers
        preload = node_preload(("torch.distributed.rpc", rpc_node_main.__module__), opts["worker_main"])
        self._launcher = make_launcher(opts, rpc_node_main, preload)
        args = (opts["master_addr"], port, opts["join_timeout"], opts["tensorpipe_options"])
        if opts.get("delayed") is not None:
            # Nodes launched ahead cannot know how many groups this process formed: both
            # sides count from 0 (the rendezvous store is new for each group).
            with rpc._init_counter_lock:
                rpc._init_counter = 0
        generation = rpc._init_counter  # see rpc_node_main
        for rank in range(1, n + 1):
            self._launcher.launch(rank, (args[0], args[1], rank, n + 1, args[2], args[3], generation, self._session))
        self._watch_processes()
        options = backend_options(opts["master_addr"], port, opts["join_timeout"], args[3])
        init_rpc_quietly(node_name(self._session, 0), 0, n + 1, options)
        self._rpc_up = True

    def _watch_processes(self) -> None:
        """Report a node process's exit at once (its calls may only fail at their timeout)."""
        sentinels = {self._launcher.sentinel(r): r for r in range(1, self.num_workers + 1)}
        sentinels.pop(None, None)
        if not sentinels:
            return

        def watch() -> None:
            left = dict(sentinels)
            while left and not self._closed:
                try:
                    ready = multiprocessing.connection.wait(list(left))
                except (OSError, ValueError):  # the launcher released them: the collector is closed
                    return
                for s in ready:
                    w = left.pop(s) - 1
                    node = self._nodes[w]
                    if node.handle is not None and not node.gone:
                        node.gone = True
                        node.gen += 1  # its pending calls' failures are not news any more
                        self._push(w, [Exited(None)])

        threading.Thread(target=watch, name="aiocollect-rpc-nodes", daemon=True).start()

    def _create(self, w: int, setup: HostSetup) -> tuple[Any, tuple[int, str, str]]:
        import torch.distributed.rpc as rpc

        self._hosted[w] += 1
        handle = (node_name(self._session, w + 1), f"{w}/{self._hosted[w]}")
        info = rpc.rpc_sync(handle[0], host_create, args=(handle[1], setup), timeout=self.options["join_timeout"])
        return handle, info

    def _call(self, handle: Any, method: str, args: tuple[Any, ...], done: Done) -> None:
        import torch.distributed.rpc as rpc

        # No timeout (0): a long poll waits for the node, and liveness judges silence.
        future = rpc.rpc_async(handle[0], host_call, args=(handle[1], method, *args), timeout=0)
        future.add_done_callback(lambda f: done(*_outcome(f)))

    def _destroy(self, w: int, handle: Any, timeout: float) -> None:
        import torch.distributed.rpc as rpc

        try:
            rpc.rpc_sync(handle[0], host_drop, args=(handle[1], timeout), timeout=timeout + 2.0)
        except Exception:  # the node is gone or hung: its process is ended at close
            pass

    def _kill(self, w: int, handle: Any) -> None:
        self._launcher.kill(w + 1)

    def _exitcode(self, w: int) -> int | None:
        launcher = self._launcher
        if launcher is None:
            return None
        launcher.reap(w + 1, 5.0)
        return launcher.exitcode(w + 1)

    def _close_engine(self) -> None:
        import torch.distributed.rpc as rpc

        if self._rpc_up:
            self._rpc_up = False
            exits = []
            for rank in range(1, self.num_workers + 1):
                try:
                    exits.append(rpc.rpc_async(node_name(self._session, rank), node_exit, timeout=2.0))
                except Exception:  # a dead node: its process is reaped below
                    pass
            for f in exits:
                try:
                    f.wait()
                except Exception:  # see above
                    pass
            rpc.shutdown(graceful=False)
        if self._launcher is not None:
            for rank in range(1, self.num_workers + 1):
                self._launcher.reap(rank, 5.0)
            self._launcher.close()


transport_class = RpcTransport
