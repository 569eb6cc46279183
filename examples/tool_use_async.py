"""A toy tool-use agent: 256 coroutine envs that call a tool server over TCP (single file).

Each env poses a sum ``a + b``. The agent may call the ``add`` tool (a request to a local
asyncio server, which answers after a lognormal delay, as a web API would) and then submit
an answer; the server grades it. Calling the tool costs a little, a right answer earns 1, a
wrong one -1, and an episode ends at the submission or after ``max_steps`` steps. The best
policy calls the tool once, then submits its result.

Every step of every env is a network round trip, so the envs spend their time waiting:
`AsyncEnvPool` keeps 256 of them in flight at once on one event loop, and the collector
records each frame as it would any env's. The agent learns with a policy gradient
(REINFORCE with a mean baseline), its updates run in a thread so the loop keeps serving.

    python examples/tool_use_async.py                 # learns in about a minute
    python examples/tool_use_async.py --total-frames 4096 --num-envs 64 --frames-per-batch 1024
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import torch
import torch.nn as nn
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from gymnasium import spaces
from tensordict import TensorDict
from torch.distributions import Categorical

from aiocollect import AsyncEnvPool, Collector


def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    seed: int = arg(1, "seed of the policy and of the questions")
    num_envs: int = arg(256, "coroutine envs stepped concurrently")
    frames_per_batch: int = arg(4096, "frames per batch (num_envs * steps)")
    total_frames: int = arg(98_304, "frame budget of the whole run")
    max_steps: int = arg(4, "steps before an unanswered episode is truncated")
    tool_cost: float = arg(0.1, "reward paid for each tool call")
    latency_ms: float = arg(5.0, "median latency of the tool server (lognormal, sigma 0.5)")
    learning_rate: float = arg(3e-2, "Adam learning rate")
    return_window: int = arg(256, "finished episodes averaged for the reported return")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_args(args: Args) -> list[str]:
    """What makes these arguments unusable (rule, value and fix for each); empty when they are fine."""
    names = ("num_envs", "frames_per_batch", "total_frames", "max_steps", "return_window")
    problems = [f"{_flag(n)} must be a positive int, got {getattr(args, n)}" for n in names if getattr(args, n) < 1]
    if problems:
        return problems
    if args.total_frames < args.frames_per_batch:
        problems.append(
            f"--total-frames ({args.total_frames}) must be at least --frames-per-batch ({args.frames_per_batch}): "
            "a whole batch is collected before the first update; raise --total-frames or lower --frames-per-batch"
        )
    if args.frames_per_batch % args.num_envs:
        problems.append(
            f"--frames-per-batch ({args.frames_per_batch}) must be a multiple of --num-envs ({args.num_envs})"
        )
    return problems


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in dataclasses.fields(Args):
        kind = {"int": int, "float": float}[f.type]
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default,
                            help=f.metadata["help"] + " (default: %(default)s)")  # fmt: skip
    args = Args(**vars(parser.parse_args()))
    problems = check_args(args)
    if problems:  # before anything starts: a run that could never train says so at once
        parser.error("; ".join(problems))
    return args


# ================================================================================================
# The tool server: "add a b" -> "a+b"; "grade a b answer" -> "1" or "0"
# ================================================================================================
class ToolServer:
    def __init__(self, latency_ms: float, seed: int) -> None:
        self.mu, self.rng = math.log(latency_ms / 1e3), random.Random(seed)

    async def handle(self, stream: SocketStream) -> None:
        reader = BufferedByteReceiveStream(stream)
        async with stream:
            while True:
                try:
                    words = (await reader.receive_until(b"\n", 128)).decode().split()
                except (anyio.EndOfStream, anyio.IncompleteRead):
                    return
                await anyio.sleep(self.rng.lognormvariate(self.mu, 0.5))  # the service's latency
                a, b = int(words[1]), int(words[2])
                reply = a + b if words[0] == "add" else int(int(words[3]) == a + b)
                await stream.send(f"{reply}\n".encode())


# ================================================================================================
# The env: observation [has_result, steps/max_steps]; actions 0 = call the tool, 1 = submit
# ================================================================================================
class ToolUseEnv:
    observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, port: int, args: Args, seed: int) -> None:
        self.port, self.args, self.rng = port, args, random.Random(seed)
        self.stream: SocketStream | None = None
        self.reader: BufferedByteReceiveStream | None = None

    async def _ask(self, line: str) -> int:
        if self.stream is None:  # connect on first use, on the loop that steps this env
            self.stream = await anyio.connect_tcp("127.0.0.1", self.port)
            self.reader = BufferedByteReceiveStream(self.stream)
        await self.stream.send(f"{line}\n".encode())
        return int(await self.reader.receive_until(b"\n", 64))  # type: ignore[union-attr]

    def _obs(self) -> np.ndarray:
        return np.array([self.result is not None, self.t / self.args.max_steps], np.float32)

    async def reset(self, *, seed: int | None = None) -> tuple[Any, dict]:
        self.a, self.b, self.t, self.result = self.rng.randrange(100), self.rng.randrange(100), 0, None
        return self._obs(), {}

    async def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        self.t += 1
        if action == 0:  # call the tool
            self.result = await self._ask(f"add {self.a} {self.b}")
            return self._obs(), -self.args.tool_cost, False, self.t >= self.args.max_steps, {}
        answer = self.result if self.result is not None else self.rng.randrange(200)  # a guess
        right = await self._ask(f"grade {self.a} {self.b} {answer}")
        return self._obs(), 1.0 if right else -1.0, True, False, {}

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


# ================================================================================================
# Policy and update
# ================================================================================================
def make_policy(actor: nn.Module):
    def policy(td: TensorDict) -> TensorDict:
        td["action"] = Categorical(logits=actor(td["observation"])).sample()
        return td

    return policy


def reinforce(batch: TensorDict, actor: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One policy-gradient step on returns-to-go within each episode of a [num_envs, T] batch."""
    reward, done = batch["next", "reward"].squeeze(-1), batch["next", "done"].squeeze(-1).float()
    ret, running = torch.zeros_like(reward), torch.zeros_like(reward[:, 0])
    for t in reversed(range(reward.shape[-1])):
        running = reward[:, t] + (1.0 - done[:, t]) * running
        ret[:, t] = running
    advantage = ret - ret.mean()
    logp = Categorical(logits=actor(batch["observation"])).log_prob(batch["action"])
    loss = -(advantage * logp).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


async def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    actor = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate)
    server = ToolServer(args.latency_ms, args.seed)
    running, finished = torch.zeros(args.num_envs), deque(maxlen=args.return_window)
    frames, start = 0, time.perf_counter()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.handle)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)

        def make_pool() -> AsyncEnvPool:
            return AsyncEnvPool([ToolUseEnv(port, args, args.seed * 10_000 + i) for i in range(args.num_envs)])

        async with Collector(make_pool, make_policy(actor), frames_per_batch=args.frames_per_batch,
                             total_frames=args.total_frames) as collector:  # fmt: skip
            async for batch in collector:
                frames += batch.numel()
                reward, done = batch["next", "reward"].squeeze(-1), batch["next", "done"].squeeze(-1)
                for t in range(reward.shape[-1]):
                    running += reward[:, t]
                    finished.extend(running[done[:, t]].tolist())
                    running[done[:, t]] = 0.0
                await anyio.to_thread.run_sync(reinforce, batch, actor, optimizer)
                await collector.update_policy_weights_()
                mean, fps = sum(finished) / max(1, len(finished)), frames / (time.perf_counter() - start)
                print(f"{frames:>8} frames  mean return {mean:+.2f}  ({fps:.0f} frames/s)")
        tg.cancel_scope.cancel()  # the server
    elapsed = time.perf_counter() - start
    print(f"stopped after {frames} frames in {elapsed:.1f}s ({frames / elapsed:.0f} frames/s)")
    print(f"final mean return over last {len(finished)} episodes: {sum(finished) / max(1, len(finished)):.2f}")


if __name__ == "__main__":
    anyio.run(main, parse_args())
