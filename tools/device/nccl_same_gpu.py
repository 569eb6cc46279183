"""What NCCL does when two processes of one group share a GPU (run by check.sh on a GPU machine).

`DistributedCollector(backend="nccl", launcher="mp")` refuses a machine with fewer than 2
GPUs, because each node's pair group holds the trainer, and NCCL documents two ranks on one
device as unsupported. This probe records what this machine's NCCL actually does: an error
(and which), success, or a hang (cut at 30 s).
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def member(rank: int, port: int, out: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    t = time.perf_counter()
    try:
        dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", 0))
        x = torch.full((4,), float(rank), device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        out.put((rank, "ok", x.tolist(), time.perf_counter() - t))
    except Exception as exc:
        out.put((rank, "error", f"{type(exc).__name__}: {str(exc)[:400]}", time.perf_counter() - t))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def main() -> int:
    if torch.cuda.device_count() < 1:
        print("no GPU")
        return 2
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=member, args=(r, 29571, out), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    results = []
    deadline = time.monotonic() + 30
    while len(results) < 2 and time.monotonic() < deadline:
        try:
            results.append(out.get(timeout=1))
        except Exception:
            pass
    for p in procs:
        p.join(2)
        if p.is_alive():
            p.kill()
    print("NCCL", torch.cuda.nccl.version(), "torch", torch.__version__)
    for rank, what, detail, seconds in sorted(results):
        print(f"rank {rank}: {what} {detail} ({seconds:.1f} s)")
    if len(results) < 2:
        print(f"HANG: {2 - len(results)} member(s) gave no answer in 30 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
