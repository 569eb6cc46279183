"""Run a collection node of a `DistributedCollector`: ``python -m aiocollect.node``.

Start one per node on any machine that can reach the trainer, with torchrun-style
variables: ``MASTER_ADDR`` (the trainer's address), ``MASTER_PORT`` (its ``tcp_port``) and
``RANK`` (1 to the number of nodes; rank 0 is the trainer). ``WORLD_SIZE`` is accepted and
ignored. The node gets everything else (env factory, policy, collector class) from the
trainer, and exits when the trainer closes it or goes away. ``AIOCOLLECT_NODE_ADDR``
optionally names the local address to connect from.

Example, with the trainer on 10.0.0.1 running
``DistributedCollector(..., launcher="external", tcp_port=29500, num_nodes=2)``::

    MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 RANK=1 python -m aiocollect.node   # machine A
    MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 RANK=2 python -m aiocollect.node   # machine B
"""

from __future__ import annotations

from ._workers._distributed_node import main_from_env

__all__ = ["main"]


def main() -> None:
    """Join the trainer named by the environment and collect until it closes this node."""
    main_from_env()


if __name__ == "__main__":
    main()
