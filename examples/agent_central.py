"""An agent served from a model server: coroutine envs call a tool server, a coroutine policy calls the model.

The agentic-RL shape, in one file. Each env poses a sum ``a + b``; the agent may call the
``add`` tool (a request to a local tool server that answers after a lognormal delay, as a web
API would) and then submit an answer, which the server grades: a right answer earns 1, a
wrong one -1, each tool call costs a little. The best policy calls the tool once, then
submits its result.

The policy is not in the collector: it is a small torch model behind a loopback *model
server* that batches the requests it receives (up to 64, or whatever came within 2 ms) and
answers each with an action and the model version. The collector's policy is a coroutine
function, a client of that server, awaited once per env and step (`AsyncBatchedCollector`
with a coroutine policy): envs wait on the tool server and on the model server, never on
each other. The learner updates the model the server runs (REINFORCE on each flat batch,
grouped by env, off the event loop) and tells the collector a new version is live.

    python examples/agent_central.py                 # learns in about a minute
    python examples/agent_central.py --total-frames 512 --num-envs 16 --frames-per-batch 256
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
import anyio.abc
import anyio.to_thread
import numpy as np
import torch
import torch.nn as nn
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from gymnasium import spaces
from tensordict import TensorDict
from torch.distributions import Categorical

from aiocollect import AsyncBatchedCollector


def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    seed: int = arg(1, "seed of the model and of the questions")
    num_envs: int = arg(128, "coroutine envs, each with its own tool and model connections")
    frames_per_batch: int = arg(2048, "frames per batch")
    total_frames: int = arg(40_960, "frame budget of the whole run")
    max_steps: int = arg(4, "steps before an unanswered episode is truncated")
    tool_cost: float = arg(0.1, "reward paid for each tool call")
    latency_ms: float = arg(5.0, "median latency of the tool server (lognormal, sigma 0.5)")
    model_batch: int = arg(64, "most requests the model server runs in one forward pass")
    learning_rate: float = arg(3e-2, "Adam learning rate")
    return_window: int = arg(256, "finished episodes averaged for the reported return")


def check_args(args: Args) -> list[str]:
    """What makes these arguments unusable (rule, value and fix for each); empty when they are fine."""
    names = ("num_envs", "frames_per_batch", "total_frames", "max_steps", "model_batch", "return_window")
    problems = [f"--{n.replace('_', '-')} must be a positive int, got {getattr(args, n)}"
                for n in names if getattr(args, n) < 1]  # fmt: skip
    if not problems and args.total_frames < args.frames_per_batch:
        problems.append(
            f"--total-frames ({args.total_frames}) must be at least --frames-per-batch ({args.frames_per_batch}): "
            "a whole batch is collected before the first update; raise --total-frames or lower --frames-per-batch"
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


async def serve_lines(listener: Any, answer: Any) -> None:
    """Serve a line protocol: each connection's lines are answered, in order, by ``answer(words)``."""

    async def handle(stream: SocketStream) -> None:
        reader = BufferedByteReceiveStream(stream)
        async with stream:
            while True:
                try:
                    words = (await reader.receive_until(b"\n", 256)).decode().split()
                except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                    return
                await stream.send(f"{await answer(words)}\n".encode())

    await listener.serve(handle)


# ================================================================================================
# The tool server ("add a b" -> a+b; "grade a b answer" -> 1 or 0) and the model server
# ("obs0 obs1" -> "action version"), which batches what its clients ask
# ================================================================================================
class ToolServer:
    def __init__(self, latency_ms: float, seed: int) -> None:
        self.mu, self.rng = math.log(latency_ms / 1e3), random.Random(seed)

    async def answer(self, words: list[str]) -> int:
        await anyio.sleep(self.rng.lognormvariate(self.mu, 0.5))  # the service's latency
        a, b = int(words[1]), int(words[2])
        return a + b if words[0] == "add" else int(int(words[3]) == a + b)


class ModelServer:
    def __init__(self, model: nn.Module, max_batch: int) -> None:
        self.model, self.max_batch, self.version = model, max_batch, 0
        self.queue: deque[tuple[list[float], Any]] = deque()
        self.arrived = anyio.Event()
        self.forwards = self.requests = 0

    async def answer(self, words: list[str]) -> str:
        done, slot = anyio.Event(), {}
        self.queue.append(([float(w) for w in words], (done, slot)))
        self.arrived.set()
        await done.wait()
        return f"{slot['action']} {slot['version']}"

    def _forward(self, obs: list[list[float]]) -> list[int]:
        with torch.no_grad():
            return Categorical(logits=self.model(torch.tensor(obs))).sample().tolist()

    async def run(self) -> None:
        while True:
            while not self.queue:
                self.arrived = anyio.Event()
                await self.arrived.wait()
            with anyio.move_on_after(0.002):  # a little longer for a fuller batch
                while len(self.queue) < self.max_batch:
                    self.arrived = anyio.Event()
                    await self.arrived.wait()
            batch = [self.queue.popleft() for _ in range(min(self.max_batch, len(self.queue)))]
            version = self.version
            actions = await anyio.to_thread.run_sync(self._forward, [obs for obs, _ in batch])
            self.forwards, self.requests = self.forwards + 1, self.requests + len(batch)
            for (_, (done, slot)), action in zip(batch, actions, strict=True):
                slot.update(action=action, version=version)
                done.set()


class Connection:
    """One line-protocol connection, opened on first use on the loop that uses it."""

    def __init__(self, port: int) -> None:
        self.port, self.stream, self.reader = port, None, None

    async def ask(self, line: str) -> str:
        if self.stream is None:
            self.stream = await anyio.connect_tcp("127.0.0.1", self.port)
            self.reader = BufferedByteReceiveStream(self.stream)
        await self.stream.send(f"{line}\n".encode())
        return (await self.reader.receive_until(b"\n", 64)).decode()

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


# ================================================================================================
# The env (observation [has_result, steps/max_steps]; 0 = call the tool, 1 = submit) and the
# coroutine policy: a client of the model server, one connection per env
# ================================================================================================
class ToolUseEnv:
    observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, port: int, args: Args, seed: int) -> None:
        self.tool, self.args, self.rng = Connection(port), args, random.Random(seed)

    def _obs(self) -> np.ndarray:
        return np.array([self.result is not None, self.t / self.args.max_steps], np.float32)

    async def reset(self, *, seed: int | None = None) -> tuple[Any, dict]:
        self.a, self.b, self.t, self.result = self.rng.randrange(100), self.rng.randrange(100), 0, None
        return self._obs(), {}

    async def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        self.t += 1
        if action == 0:  # call the tool
            self.result = int(await self.tool.ask(f"add {self.a} {self.b}"))
            return self._obs(), -self.args.tool_cost, False, self.t >= self.args.max_steps, {}
        answer = self.result if self.result is not None else self.rng.randrange(200)  # a guess
        right = int(await self.tool.ask(f"grade {self.a} {self.b} {answer}"))
        return self._obs(), 1.0 if right else -1.0, True, False, {}

    async def aclose(self) -> None:
        await self.tool.aclose()


class ModelClient:
    """The collector's policy: ``await policy(td)`` asks the model server for one env's action."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connections: dict[int, Connection] = {}  # one per env, as each env's agent would have

    async def __call__(self, td: TensorDict) -> torch.Tensor:
        env = int(td["collector", "env_id"])  # which env asks: each has its own connection
        conn = self.connections.get(env) or self.connections.setdefault(env, Connection(self.port))
        obs = td["observation"].tolist()
        action, _version = (await conn.ask(f"{obs[0]} {obs[1]}")).split()
        return torch.tensor(int(action))

    async def aclose(self) -> None:
        for conn in self.connections.values():
            await conn.aclose()


# ================================================================================================
# The update: REINFORCE on a flat batch grouped by env (each env's last frame is marked
# truncated, so returns never run from one env's frames into the next one's)
# ================================================================================================
def reinforce(batch: TensorDict, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    reward, done = batch["next", "reward"].squeeze(-1), batch["next", "done"].squeeze(-1).float()
    ret, running = torch.zeros_like(reward), torch.zeros(())
    for t in reversed(range(reward.shape[0])):
        running = reward[t] + (1.0 - done[t]) * running
        ret[t] = running
    advantage = ret - ret.mean()
    logp = Categorical(logits=model(batch["observation"])).log_prob(batch["action"])
    loss = -(advantage * logp).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


async def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
    tools, brain = ToolServer(args.latency_ms, args.seed), ModelServer(model, args.model_batch)
    running, finished = {}, deque(maxlen=args.return_window)
    frames, start = 0, time.perf_counter()
    tool_listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    model_listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with tool_listener, model_listener, anyio.create_task_group() as tg:
        tg.start_soon(serve_lines, tool_listener, tools.answer)
        tg.start_soon(serve_lines, model_listener, brain.answer)
        tg.start_soon(brain.run)
        tool_port = tool_listener.extra(anyio.abc.SocketAttribute.local_port)
        client = ModelClient(model_listener.extra(anyio.abc.SocketAttribute.local_port))
        envs = [lambda i=i: ToolUseEnv(tool_port, args, args.seed * 10_000 + i) for i in range(args.num_envs)]
        async with AsyncBatchedCollector(envs, policy=client, frames_per_batch=args.frames_per_batch,
                                         total_frames=args.total_frames, set_truncated=True) as collector:  # fmt: skip
            async for batch in collector:
                frames += batch.numel()
                traj, reward = batch["collector", "traj_ids"].tolist(), batch["next", "reward"].squeeze(-1).tolist()
                ended = batch["next", "terminated"].squeeze(-1).tolist()
                for k, r, end in zip(traj, reward, ended, strict=True):
                    running[k] = running.get(k, 0.0) + r
                    if end:
                        finished.append(running.pop(k))
                await anyio.to_thread.run_sync(reinforce, batch, model, optimizer)
                brain.version += 1  # the server runs the model just trained from its next batch on
                await collector.update_policy_weights_()  # ... and later frames say so
                mean, fps = sum(finished) / max(1, len(finished)), frames / (time.perf_counter() - start)
                print(f"{frames:>8} frames  mean return {mean:+.2f}  policy v{collector.policy_version}  "
                      f"model batch {brain.requests / max(1, brain.forwards):.1f}  ({fps:.0f} frames/s)")  # fmt: skip
        await client.aclose()
        tg.cancel_scope.cancel()  # the servers
    elapsed = time.perf_counter() - start
    print(f"stopped after {frames} frames in {elapsed:.1f}s ({frames / elapsed:.0f} frames/s)")
    print(f"final mean return over last {len(finished)} episodes: {sum(finished) / max(1, len(finished)):.2f}")


if __name__ == "__main__":
    anyio.run(main, parse_args())
