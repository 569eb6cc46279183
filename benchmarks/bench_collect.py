#!/usr/bin/env python
"""Throughput, first-batch latency and event-loop responsiveness of aiocollect.

Compares, in ONE process and on the same workloads (env + 64-64 MLP policy):

* a bare hand-written collection loop (no framework; the reference, ratio 1.00),
* aiocollect's blocking ``SyncDataCollector`` and async ``Collector`` (asyncio and uvloop),
* TorchRL's ``torchrl.collectors.Collector`` (skipped with a note if torchrl is missing).

For every row it prints frames/s (median of N repeats after a warmup), the ratio to the bare
loop of the same workload, the ratio to TorchRL, and the time from construction to the first
batch in hand. For the async collector on CartPole-v1 x8 it also measures how late a 1 ms
heartbeat task on the same event loop wakes up while collection runs. The result ends with a
Markdown table and PASS/FAIL lines against the project's targets.

Usage::

    python benchmarks/bench_collect.py            # full run (< 3 min on 2 cores)
    python benchmarks/bench_collect.py --quick    # CI smoke (< 30 s)

See benchmarks/README.md for what each row means and the fairness rules.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import gymnasium as gym
import numpy as np
import torch
from torch import nn

import aiocollect

FPB = 800  # frames per batch, every row
TARGETS = {"bare_ratio": 0.85, "torchrl_ratio": 5.0, "first_batch_ms": 500.0}

# --------------------------------------------------------------------------------------------
# Workloads: the env factories and the policy, shared verbatim by every row.
# --------------------------------------------------------------------------------------------


def _mlp(n_in: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_out))


class DiscretePolicy(nn.Module):
    """obs -> int64 action index (CartPole)."""

    def __init__(self, n_obs: int, n_act: int) -> None:
        super().__init__()
        self.mlp = _mlp(n_obs, n_act)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.mlp(observation).argmax(-1)


class ContinuousPolicy(nn.Module):
    """obs -> float32 action in [-2, 2] of shape [..., 1] (Pendulum)."""

    def __init__(self, n_obs: int, n_act: int) -> None:
        super().__init__()
        self.mlp = _mlp(n_obs, n_act)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mlp(observation)) * 2.0


SAME_STEP = gym.vector.AutoresetMode.SAME_STEP
NEXT_STEP = gym.vector.AutoresetMode.NEXT_STEP
DISABLED = gym.vector.AutoresetMode.DISABLED


def vec_fn(env_id: str, n: int, mode: gym.vector.AutoresetMode) -> Callable[[], gym.vector.VectorEnv]:
    def make() -> gym.vector.VectorEnv:
        return gym.make_vec(env_id, n, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode})

    return make


def single_fn(env_id: str) -> Callable[[], gym.Env]:
    def make() -> gym.Env:
        return gym.make(env_id)

    return make


@dataclass
class Workload:
    key: str
    title: str
    env_id: str
    num_envs: int  # 0 = a single (unbatched) gymnasium Env
    policy: nn.Module

    def env_fn(self, mode: gym.vector.AutoresetMode = SAME_STEP) -> Callable[[], Any]:
        return vec_fn(self.env_id, self.num_envs, mode) if self.num_envs else single_fn(self.env_id)


def make_workloads() -> list[Workload]:
    torch.manual_seed(0)  # same MLP weights on every run
    return [
        Workload("cartpole1", "CartPole-v1 x1", "CartPole-v1", 0, DiscretePolicy(4, 2)),
        Workload("cartpole8", "CartPole-v1 x8 (SyncVectorEnv)", "CartPole-v1", 8, DiscretePolicy(4, 2)),
        Workload("pendulum1", "Pendulum-v1 x1", "Pendulum-v1", 0, ContinuousPolicy(3, 1)),
    ]


# --------------------------------------------------------------------------------------------
# (a) The bare loop: no framework, preallocated [T, N, ...] tensors, one batch copy per batch.
# --------------------------------------------------------------------------------------------


def bare_loop(
    env_fn: Callable[[], Any], policy: nn.Module, fpb: int, total: int, *, same_step: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """Yield batches of real transitions (``same_step=True``) or raw NEXT_STEP output.

    With a SAME_STEP vector env the rows that ended get their terminal observation from
    ``info["final_obs"]`` (the returned obs is already the reset obs, used as the next input).
    With a NEXT_STEP vector env (``same_step=False``) whatever gymnasium returns is recorded,
    including the phantom "reset" frame after every episode end: cheaper, but not the same data.
    A single env is reset by hand when it ends.
    """
    env = env_fn()
    try:
        vec = isinstance(env, gym.vector.VectorEnv)
        if vec:
            B: tuple[int, ...] = (env.num_envs,)
            obs_space, act_space = env.single_observation_space, env.single_action_space
        else:
            B = ()
            obs_space, act_space = env.observation_space, env.action_space
        n = B[0] if B else 1
        T = math.ceil(fpb / n)
        discrete = isinstance(act_space, gym.spaces.Discrete)
        act_shape, act_dtype = ((), torch.int64) if discrete else (tuple(act_space.shape), torch.float32)
        obs_b = torch.zeros((T, *B, *obs_space.shape), dtype=torch.float32)
        next_b = torch.zeros_like(obs_b)
        act_b = torch.zeros((T, *B, *act_shape), dtype=act_dtype)
        rew_b = torch.zeros((T, *B), dtype=torch.float32)
        term_b = torch.zeros((T, *B), dtype=torch.bool)
        trunc_b = torch.zeros_like(term_b)
        done_b = torch.zeros_like(term_b)
        buf = {
            "observation": obs_b,
            "action": act_b,
            "next_observation": next_b,
            "reward": rew_b,
            "terminated": term_b,
            "truncated": trunc_b,
            "done": done_b,
        }
        o, _ = env.reset()
        cur = torch.from_numpy(np.asarray(o, dtype=np.float32))
        frames = 0
        with torch.no_grad():
            while frames < total:
                for t in range(T):
                    obs_t = obs_b[t]
                    obs_t.copy_(cur)
                    a = policy(obs_t)
                    act_b[t].copy_(a)
                    if vec:
                        o, r, te, tr, info = env.step(a.numpy())
                        nxt = next_b[t]
                        nxt.copy_(torch.from_numpy(o))
                        if same_step and "_final_obs" in info:
                            final = info["final_obs"]
                            for i in np.flatnonzero(info["_final_obs"]):
                                nxt[i].copy_(torch.from_numpy(final[i]))
                        rew_b[t].copy_(torch.from_numpy(r))
                        te_t, tr_t = torch.from_numpy(te), torch.from_numpy(tr)
                        term_b[t].copy_(te_t)
                        trunc_b[t].copy_(tr_t)
                        torch.logical_or(te_t, tr_t, out=done_b[t])
                        cur = torch.from_numpy(o)  # reset obs for rows that ended (SAME_STEP)
                    else:
                        o, r, te, tr, _ = env.step(a.item() if discrete else a.numpy())
                        nxt = next_b[t]
                        nxt.copy_(torch.from_numpy(o))
                        rew_b[t] = r
                        term_b[t] = te
                        trunc_b[t] = tr
                        done_b[t] = te or tr
                        if te or tr:
                            o, _ = env.reset()
                            cur = torch.from_numpy(o)
                        else:
                            cur = nxt
                frames += T * n
                yield {k: v.clone() for k, v in buf.items()}
    finally:
        env.close()


# --------------------------------------------------------------------------------------------
# (b) aiocollect
# --------------------------------------------------------------------------------------------


def aio_blocking(env_fn: Callable[[], Any], policy: nn.Module, fpb: int, total: int) -> Iterator[Any]:
    with aiocollect.SyncDataCollector(env_fn, policy, frames_per_batch=fpb, total_frames=total) as c:
        yield from c


@dataclass
class Run:
    first_s: float
    fps: float
    frames: int
    dones: int = 0  # episode ends seen (sanity check: every row of a workload should see alike)
    gaps: list[float] = field(default_factory=list)
    cpu_fps: float = float("nan")  # same frames per second of process CPU time (all threads)


def _fps(t_first: float, t_last: float, frames_after_first: int) -> float:
    return frames_after_first / (t_last - t_first) if t_last > t_first else float("nan")


def _count_dones(batch: Any) -> int:
    return int(batch["done"].sum()) if isinstance(batch, dict) else int(batch["next", "done"].sum())


def measure_iter(make: Callable[[], Iterator[Any]]) -> Run:
    """Time construction-to-first-batch and steady-state frames/s (batches after the first)."""
    gc.collect()
    t0 = time.perf_counter()
    it = make()
    t_first = t_last = c_first = c_last = 0.0
    frames = first_frames = dones = 0
    for i, batch in enumerate(it):
        t_last, c_last = time.perf_counter(), time.process_time()
        n = batch.numel() if hasattr(batch, "numel") else batch["reward"].numel()
        frames += n
        dones += _count_dones(batch)  # one reduction per batch: negligible, same for every row
        if i == 0:
            t_first, c_first, first_frames = t_last, c_last, n
    after = frames - first_frames
    return Run(
        t_first - t0,
        _fps(t_first, t_last, after),
        frames,
        dones,
        cpu_fps=_fps(c_first, c_last, after),
    )


async def _aio_async_run(env_fn: Callable[[], Any], policy: nn.Module, fpb: int, total: int, heartbeat: bool) -> Run:
    gaps: list[float] = []
    done = False

    async def beat() -> None:
        last = time.perf_counter()
        while not done:
            await anyio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async with anyio.create_task_group() as tg:
        if heartbeat:
            tg.start_soon(beat)
            await anyio.sleep(0.01)  # let the heartbeat settle before construction starts
        t0 = time.perf_counter()
        t_first = t_last = c_first = c_last = 0.0
        frames = first_frames = dones = 0
        async with aiocollect.Collector(env_fn, policy, frames_per_batch=fpb, total_frames=total) as c:
            async for batch in c:
                t_last, c_last = time.perf_counter(), time.process_time()
                if not frames:
                    t_first, c_first, first_frames = t_last, c_last, batch.numel()
                frames += batch.numel()
                dones += _count_dones(batch)
        done = True
    after = frames - first_frames
    return Run(
        t_first - t0,
        _fps(t_first, t_last, after),
        frames,
        dones,
        gaps,
        _fps(c_first, c_last, after),
    )


def measure_async(
    env_fn: Callable[[], Any],
    policy: nn.Module,
    fpb: int,
    total: int,
    *,
    uvloop: bool,
    heartbeat: bool = False,
) -> Run:
    gc.collect()
    opts = {"use_uvloop": True} if uvloop else {}

    async def main() -> Run:
        return await _aio_async_run(env_fn, policy, fpb, total, heartbeat)

    return anyio.run(main, backend="asyncio", backend_options=opts)


def verify_same_data(w: Workload, batches: int = 2) -> str | None:
    """Check that the bare loop and aiocollect produce identical transitions from seeded envs.

    Returns None when obs, action, next obs, reward, done and terminated match bit for bit, else
    a description of the first difference. This is what makes the bare loop a fair reference.
    """
    base = w.env_fn(SAME_STEP)

    def seeded() -> Any:
        env = base()
        env.reset(seed=1234)  # both collectors then continue the same env RNG stream
        return env

    bare = list(bare_loop(seeded, w.policy, FPB, batches * FPB, same_step=True))
    with aiocollect.SyncDataCollector(seeded, w.policy, frames_per_batch=FPB, total_frames=batches * FPB) as c:
        aio = list(c)
    if len(aio) != len(bare):
        return f"{len(aio)} aiocollect batches vs {len(bare)} bare batches"
    pairs = [
        ("observation", "observation"),
        ("action", "action"),
        ("next_observation", ("next", "observation")),
        ("reward", ("next", "reward")),
        ("done", ("next", "done")),
        ("terminated", ("next", "terminated")),
    ]
    for i, (b, a) in enumerate(zip(bare, aio, strict=True)):
        for bk, ak in pairs:
            av = a[ak]
            if bk in ("reward", "done", "terminated"):
                av = av.squeeze(-1)
            bv = b[bk].movedim(0, 1) if w.num_envs else b[bk]  # [T, N] -> TorchRL's [N, T]
            if bv.shape != av.shape or not torch.equal(bv.to(av.dtype), av):
                return f"batch {i}: {bk!r} differs"
    return None


# --------------------------------------------------------------------------------------------
# (c) TorchRL
# --------------------------------------------------------------------------------------------


def torchrl_available() -> str | None:
    """Return None if torchrl is importable, else the reason."""
    try:
        import torchrl  # noqa: F401
        from torchrl.collectors import Collector  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def torchrl_collector_class() -> tuple[type, str]:
    import torchrl.collectors as trc

    if hasattr(trc, "Collector"):
        return trc.Collector, "torchrl.collectors.Collector"
    return trc.SyncDataCollector, "torchrl.collectors.SyncDataCollector"  # older TorchRL


def torchrl_env_fn(w: Workload, variant: str) -> Callable[[], Any]:
    from torchrl.envs import GymEnv, GymWrapper, SerialEnv

    if w.num_envs == 0:
        return lambda: GymEnv(w.env_id, categorical_action_encoding=True)
    if variant == "wrapper":
        # TorchRL's fastest in-process option: its GymWrapper around the very same gymnasium
        # SyncVectorEnv, in AutoresetMode.DISABLED (the mode TorchRL documents as preferred:
        # TorchRL resets the finished rows itself, no phantom frames).
        return lambda: GymWrapper(vec_fn(w.env_id, w.num_envs, DISABLED)(), categorical_action_encoding=True)
    if variant == "serial":
        return lambda: SerialEnv(w.num_envs, lambda: GymEnv(w.env_id, categorical_action_encoding=True))
    if variant == "num_envs":
        # GymEnv(..., num_envs=n) builds a gymnasium *AsyncVectorEnv*: n subprocesses.
        return lambda: GymEnv(w.env_id, num_envs=w.num_envs, categorical_action_encoding=True)
    raise ValueError(variant)


def torchrl_iter(w: Workload, variant: str, fpb: int, total: int) -> Iterator[Any]:
    from tensordict.nn import TensorDictModule

    cls, _ = torchrl_collector_class()
    policy = TensorDictModule(w.policy, in_keys=["observation"], out_keys=["action"])
    c = cls(torchrl_env_fn(w, variant), policy, frames_per_batch=fpb, total_frames=total)
    try:
        yield from c
    finally:
        c.shutdown()


# --------------------------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------------------------


@dataclass
class Row:
    workload: str
    name: str
    kind: str  # "bare" | "bare_next" | "aio" | "aio_extra" | "torchrl" | "torchrl_extra"
    runner: Callable[[int], Run]  # total_frames -> Run
    runs: list[Run] = field(default_factory=list)
    cold_first_s: float = float("nan")
    total: int = 0

    def _median(self, values: Iterator[float]) -> float:
        v = list(values)
        return statistics.median(v) if v else float("nan")

    @property
    def fps(self) -> float:
        return self._median(r.fps for r in self.runs)

    @property
    def cpu_fps(self) -> float:
        return self._median(r.cpu_fps for r in self.runs)

    @property
    def first_ms(self) -> float:
        return self._median(r.first_s * 1e3 for r in self.runs)

    @property
    def ep_len(self) -> float:
        frames, dones = sum(r.frames for r in self.runs), sum(r.dones for r in self.runs)
        return frames / dones if dones else float("inf")

    @property
    def spread(self) -> float:
        f = [r.fps for r in self.runs]
        return (max(f) - min(f)) / statistics.median(f) if len(f) > 1 else 0.0


@dataclass
class Settings:
    repeats: int
    target_s: float  # approximate length of one timed run
    min_batches: int  # per timed run; the first batch is not part of frames/s
    warm_batches: int
    max_batches: int = 400


def run_rows(rows: list[Row], st: Settings, log: Callable[[str], None]) -> None:
    """Warm up every row (recording its cold first batch and sizing its runs), then time them
    round robin, so that slow drift on the machine affects every row alike."""
    for row in rows:
        warm = row.runner(st.warm_batches * FPB)
        row.cold_first_s = warm.first_s
        # A one-batch warmup has no steady-state rate; its first batch gives a lower bound.
        fps = warm.fps if math.isfinite(warm.fps) else FPB / warm.first_s
        n = round(st.target_s * fps / FPB) + 1
        row.total = max(st.min_batches, min(st.max_batches, n)) * FPB
        log(
            f"  warmup  {row.workload:<10} {row.name:<44} cold first batch "
            f"{row.cold_first_s * 1e3:6.0f} ms, {row.total // FPB} batches/run"
        )
    for rep in range(st.repeats):
        for row in rows:
            r = row.runner(row.total)
            row.runs.append(r)
            log(
                f"  run {rep + 1}/{st.repeats} {row.workload:<10} {row.name:<44} "
                f"{r.fps:8.0f} frames/s  first {r.first_s * 1e3:5.0f} ms"
            )


def build_rows(workloads: list[Workload], quick: bool) -> list[Row]:
    """Bare-loop and aiocollect rows (TorchRL rows are built separately)."""

    def bare(f: Callable[[], Any], p: nn.Module, same_step: bool) -> Callable[[int], Run]:
        return lambda n: measure_iter(lambda: bare_loop(f, p, FPB, n, same_step=same_step))

    def blocking(f: Callable[[], Any], p: nn.Module) -> Callable[[int], Run]:
        return lambda n: measure_iter(lambda: aio_blocking(f, p, FPB, n))

    def async_(f: Callable[[], Any], p: nn.Module, uvloop: bool) -> Callable[[int], Run]:
        return lambda n: measure_async(f, p, FPB, n, uvloop=uvloop)

    rows: list[Row] = []
    for w in workloads:
        ss, ns, pol, vec = w.env_fn(SAME_STEP), w.env_fn(NEXT_STEP), w.policy, bool(w.num_envs)
        candidates = [
            (True, "bare loop", "bare", bare(ss, pol, True)),
            (vec, "bare (next-step, phantom frames)", "bare_next", bare(ns, pol, False)),
            (True, "aiocollect SyncDataCollector", "aio", blocking(ss, pol)),
            (vec or not quick, "aiocollect Collector (asyncio)", "aio", async_(ss, pol, False)),
            (vec or not quick, "aiocollect Collector (uvloop)", "aio", async_(ss, pol, True)),
            (
                vec and not quick,
                "aiocollect SyncDataCollector, next-step env",
                "aio_extra",
                blocking(ns, pol),
            ),
        ]
        rows += [Row(w.key, name, kind, run) for on, name, kind, run in candidates if on]
    return rows


def build_torchrl_rows(workloads: list[Workload], quick: bool, subproc: bool) -> list[Row]:
    _, cls_name = torchrl_collector_class()
    short = cls_name.rsplit(".", 1)[-1]
    rows: list[Row] = []
    for w in workloads:
        if quick and not w.num_envs:
            continue
        if w.num_envs:
            variants = [("wrapper", "torchrl", "GymWrapper(SyncVectorEnv)")]
            if not quick:
                variants.append(("serial", "torchrl_extra", "SerialEnv(8, GymEnv)"))
            if subproc:
                variants.append(("num_envs", "torchrl_extra", "GymEnv num_envs=8, subproc"))
        else:
            variants = [("single", "torchrl", "GymEnv")]
        for variant, kind, label in variants:
            runner = lambda n, w=w, v=variant: measure_iter(lambda: torchrl_iter(w, v, FPB, n))  # noqa: E731
            rows.append(Row(w.key, f"TorchRL {short} ({label})", kind, runner))
    return rows


def responsiveness(w8: Workload, bare_fps: float, target_s: float) -> dict[str, dict[str, float]]:
    """Heartbeat gaps while the async collector runs CartPole x8, under asyncio and uvloop."""
    total = max(3, min(400, round(max(target_s, 0.5) * bare_fps / FPB) + 1)) * FPB
    out: dict[str, dict[str, float]] = {}

    def summary(gaps: list[float], fps: float) -> dict[str, float]:
        ms = np.asarray(gaps) * 1e3
        return {
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max()),
            "ticks": len(gaps),
            "fps": fps,
        }

    for label, uv in (("asyncio", False), ("uvloop", True)):
        run = measure_async(w8.env_fn(SAME_STEP), w8.policy, FPB, total, uvloop=uv, heartbeat=True)
        out[label] = summary(run.gaps, run.fps)
    out["idle loop (reference)"] = summary(anyio.run(_idle_heartbeat), float("nan"))
    return out


async def _idle_heartbeat(seconds: float = 0.3) -> list[float]:
    gaps: list[float] = []
    last = time.perf_counter()
    end = last + seconds
    while last < end:
        await anyio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    return gaps


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}x" if math.isfinite(x) else "n/a"


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return float("nan")


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def paired(w: Workload, pairs: int) -> list[float]:
    """aiocollect/bare-loop speed ratios of single batches that alternate in one process.

    Both run side by side from the start, so a drift of the machine's speed (±20% from
    minute to minute on a small VM) hits both alike: each pair times one batch of each, in
    alternating order (ABBA), and its ratio is bare-loop time over SyncDataCollector time.
    """
    bare = bare_loop(w.env_fn(), w.policy, FPB, 10**15, same_step=True)
    ratios: list[float] = []
    with aiocollect.SyncDataCollector(w.env_fn(), w.policy, frames_per_batch=FPB, total_frames=-1) as c:
        aio = iter(c)
        for _ in range(3):  # warm-up: allocation, first-call costs
            next(bare), next(aio)
        for i in range(pairs):
            order = (bare, aio) if i % 2 == 0 else (aio, bare)
            took = {}
            for it in order:
                t0 = time.perf_counter()
                next(it)
                took[id(it)] = time.perf_counter() - t0
            ratios.append(took[id(bare)] / took[id(aio)])
    bare.close()
    return ratios


def _quantile(ordered: list[float], f: float) -> float:
    """The ``f`` quantile of a sorted, non-empty list (the nearest rank at or below it)."""
    return ordered[min(len(ordered) - 1, int(f * len(ordered)))]


def run_paired(workloads: list[Workload], pairs: int, log: Callable[[str], None]) -> None:
    log(f"\npaired: {pairs} alternating batch pairs per workload (ratio = aiocollect speed / bare loop)")
    log("\n| workload | median | p25 | p75 | min | max |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for w in workloads:
        r = sorted(paired(w, pairs))
        p25, p75 = _quantile(r, 0.25), _quantile(r, 0.75)
        log(f"| {w.title} | {statistics.median(r):.2f}x | {p25:.2f}x | {p75:.2f}x | {r[0]:.2f}x | {r[-1]:.2f}x |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="See benchmarks/README.md for what each row means.",
    )
    ap.add_argument("--quick", action="store_true", help="short CI smoke run (< 30 s), noisy")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per row (default 3)")
    ap.add_argument(
        "--target-seconds",
        type=float,
        default=None,
        help="approximate length of one timed run (default 1.0; 0.1 with --quick)",
    )
    ap.add_argument(
        "--workload",
        action="append",
        choices=["cartpole1", "cartpole8", "pendulum1"],
        help="run only this workload (repeatable); the targets need cartpole8",
    )
    ap.add_argument("--no-torchrl", action="store_true", help="skip the TorchRL rows")
    ap.add_argument(
        "--torchrl-subproc",
        action="store_true",
        help="also run TorchRL's GymEnv(num_envs=8): a gymnasium AsyncVectorEnv, 8 subprocesses",
    )
    ap.add_argument(
        "--no-verify",
        action="store_true",
        help="skip checking that the bare loop and aiocollect produce identical data",
    )
    ap.add_argument(
        "--paired",
        type=int,
        metavar="N",
        help="only the paired mode: N alternating batches of the bare loop and SyncDataCollector "
        "in one process; prints the median speed ratio (robust to machine drift)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--strict", action="store_true", help="exit with status 1 if a target FAILs")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    st = Settings(
        repeats=args.repeats,
        target_s=args.target_seconds or (0.1 if quick else 1.0),
        min_batches=2 if quick else 3,
        warm_batches=1 if quick else 3,
    )
    t_start, load_start = time.perf_counter(), _loadavg()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")

    def log(msg: str = "") -> None:
        print(msg, flush=True)

    trl_missing = "disabled with --no-torchrl" if args.no_torchrl else torchrl_available()
    if trl_missing is None:
        logging.getLogger("torchrl").setLevel(logging.WARNING)  # silence its INFO chatter
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tensordict": _dist_version("tensordict"),
        "gymnasium": gym.__version__,
        "anyio": _dist_version("anyio"),
        "uvloop": _dist_version("uvloop"),
        "torchrl": _dist_version("torchrl") if trl_missing is None else "not used",
        "aiocollect": aiocollect.__version__,
    }
    mode = "QUICK (async rows and TorchRL on CartPole x8 only)" if quick else "full"
    log(f"bench_collect: {mode} run, {st.repeats} timed runs/row after a warmup, ~{st.target_s:g} s each")
    log(
        f"  {platform.platform()}, {os.cpu_count()} CPUs, "
        f"torch threads={torch.get_num_threads()}, frames_per_batch={FPB}"
    )
    log("  " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if trl_missing is not None:
        log(f"  NOTE: TorchRL rows skipped ({trl_missing})")
    log(f"  load average (1 min) at start: {load_start:.2f}")
    if load_start > 0.5:
        log("  WARNING: the machine is not idle; other processes share the CPUs and add noise.")

    workloads = [w for w in make_workloads() if not args.workload or w.key in args.workload]
    if args.paired:
        run_paired(workloads, args.paired, log)
        return 0
    titles = {w.key: w.title for w in workloads}
    checks: list[tuple[str, bool | None, str]] = []

    if not args.no_verify:
        log("\n[0/3] same-data check: bare loop vs aiocollect on seeded envs")
        for w in workloads:
            if quick and not w.num_envs:
                continue
            err = verify_same_data(w)
            log(f"  {w.title:<32} {'identical transitions' if err is None else 'MISMATCH: ' + err}")
            if err is not None:
                checks.append((f"{w.title}: bare loop and aiocollect collect identical data", False, err))

    rows = build_rows(workloads, quick)
    phase = time.perf_counter()
    log("\n[1/3] bare loop and aiocollect")
    for w in workloads:
        run_rows([r for r in rows if r.workload == w.key], st, log)
    log(f"  ({time.perf_counter() - phase:.1f} s)")

    if trl_missing is None:
        # Last, so that importing and running TorchRL cannot disturb the other rows.
        phase = time.perf_counter()
        log(f"\n[2/3] TorchRL ({torchrl_collector_class()[1]})")
        trl_rows = build_torchrl_rows(workloads, quick, args.torchrl_subproc)
        for w in workloads:
            run_rows([r for r in trl_rows if r.workload == w.key], st, log)
        rows += trl_rows
        log(f"  ({time.perf_counter() - phase:.1f} s)")

    by_wl = {w.key: [r for r in rows if r.workload == w.key] for w in workloads}

    def ref(wl: str, kind: str) -> Row | None:
        return next((r for r in by_wl.get(wl, []) if r.kind == kind), None)

    resp: dict[str, dict[str, float]] = {}
    b8 = ref("cartpole8", "bare")
    if b8 is not None:
        log("\n[3/3] event-loop responsiveness: async Collector on CartPole x8 + 1 ms heartbeat")
        resp = responsiveness(next(w for w in workloads if w.key == "cartpole8"), b8.fps, st.target_s)

    # ------------------------------------------------------------------------------ results
    table: list[dict[str, Any]] = []
    for w in workloads:
        bare, trl = ref(w.key, "bare"), ref(w.key, "torchrl")
        for r in by_wl[w.key]:
            vs_trl = r.fps / trl.fps if trl and r.kind.startswith(("aio", "bare")) else math.nan
            table.append(
                {
                    "workload": titles[w.key],
                    "row": r.name,
                    "kind": r.kind,
                    "fps": r.fps,
                    "vs_bare": r.fps / bare.fps if bare else math.nan,
                    "vs_torchrl": vs_trl,
                    "first_ms": r.first_ms,
                    "cold_first_ms": r.cold_first_s * 1e3,
                    "spread": r.spread,
                    "ep_len": r.ep_len,
                    "cpu_fps": r.cpu_fps,
                    "cpu_vs_bare": r.cpu_fps / bare.cpu_fps if bare else math.nan,
                    "frames_per_run": r.total,
                    "runs_fps": [x.fps for x in r.runs],
                }
            )

    # Targets: CartPole x8 for the ratios, every aiocollect row for the first batch.
    t8 = ref("cartpole8", "torchrl")
    aio8 = [r for r in by_wl.get("cartpole8", []) if r.kind == "aio"]
    if b8 is not None:
        for r in aio8:
            x = r.fps / b8.fps
            checks.append(
                (
                    f"CartPole x8: {r.name} >= {TARGETS['bare_ratio']}x bare loop",
                    x >= TARGETS["bare_ratio"],
                    f"{x:.2f}x",
                )
            )
        for r in aio8:
            desc = f"CartPole x8: {r.name} >= {TARGETS['torchrl_ratio']:g}x TorchRL"
            if t8 is None:
                checks.append((desc, None, "TorchRL not run"))
            else:
                x = r.fps / t8.fps
                checks.append((desc, x >= TARGETS["torchrl_ratio"], f"{x:.2f}x"))
    limit = TARGETS["first_batch_ms"]
    for r in rows:
        if r.kind == "aio":
            desc = f"{titles[r.workload]}: {r.name} first batch < {limit:.0f} ms"
            val = f"{r.first_ms:.0f} ms (cold {r.cold_first_s * 1e3:.0f} ms)"
            checks.append((desc, r.first_ms < limit, val))

    log("\n" + "=" * 100)
    log(
        f"RESULTS: frames/s = median of {st.repeats} timed runs after a warmup; 1st ms = median time to the first batch"
    )
    hdr = (
        f"{'workload':<30} {'row':<46} {'frames/s':>9} {'x bare':>7} {'x TorchRL':>9} "
        f"{'1st ms':>7} {'cold ms':>8} {'spread':>7} {'ep len':>7} {'CPU fr/s':>9} "
        f"{'CPU x bare':>10}"
    )
    log(hdr)
    log("-" * len(hdr))
    for t in table:
        log(
            f"{t['workload']:<30} {t['row']:<46} {t['fps']:9.0f} {fmt_ratio(t['vs_bare']):>7} "
            f"{fmt_ratio(t['vs_torchrl']):>9} {t['first_ms']:7.0f} {t['cold_first_ms']:8.0f} "
            f"{t['spread'] * 100:6.1f}% {t['ep_len']:7.1f} {t['cpu_fps']:9.0f} "
            f"{fmt_ratio(t['cpu_vs_bare']):>10}"
        )
    log("  spread: (max - min) / median of the timed runs. ep len: frames per episode end seen, a")
    log("  check that the rows of a workload collect alike data (the phantom-frame row counts its")
    log("  extra frames). CPU fr/s: frames per second of process CPU time (all threads); less")
    log("  sensitive to other processes, blind to hand-off waits. Targets use wall-clock frames/s.")

    if t8 is not None or any(r.kind == "torchrl" for r in rows):
        log("\naiocollect vs TorchRL (wall-clock frames/s ratio, same workload):")
        for w in workloads:
            trl = ref(w.key, "torchrl")
            if trl is not None:
                parts = [
                    f"{r.name.removeprefix('aiocollect ')} {r.fps / trl.fps:.2f}x"
                    for r in by_wl[w.key]
                    if r.kind == "aio"
                ]
                log(f"  {w.title:<31} vs {trl.name.removeprefix('TorchRL ')}: " + ", ".join(parts))

    if resp:
        log("\nEvent-loop responsiveness: gap between wakeups of a task doing 'await anyio.sleep(0.001)' in a loop")
        for label, v in resp.items():
            extra = f", collecting at {v['fps']:.0f} frames/s" if math.isfinite(v["fps"]) else ""
            log(
                f"  {label:<22} p50 {v['p50_ms']:6.2f} ms  p99 {v['p99_ms']:6.2f} ms  "
                f"max {v['max_ms']:7.2f} ms  ({v['ticks']} ticks{extra})"
            )

    log("\nTargets:")
    any_fail = False
    for desc, ok, val in checks:
        any_fail |= ok is False
        log(f"  [{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}] {desc}: {val}")

    md = [
        "| workload | collector | frames/s | vs bare loop | vs TorchRL | first batch (ms) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for t in table:
        trl_cell = fmt_ratio(t["vs_torchrl"]) if math.isfinite(t["vs_torchrl"]) else "-"
        md.append(
            f"| {t['workload']} | {t['row']} | {t['fps']:,.0f} | {fmt_ratio(t['vs_bare'])} "
            f"| {trl_cell} | {t['first_ms']:.0f} |"
        )
    if resp:
        md += [
            "",
            "| event loop while the async Collector runs CartPole-v1 x8 | p50 gap (ms) | p99 gap (ms) | max gap (ms) |",
            "| --- | ---: | ---: | ---: |",
        ]
        md += [f"| {k} | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} | {v['max_ms']:.2f} |" for k, v in resp.items()]
    md += [
        "",
        (
            f"_Python {versions['python']}, torch {versions['torch']}, tensordict "
            f"{versions['tensordict']}, gymnasium {versions['gymnasium']}, "
            f"torchrl {versions['torchrl']}, aiocollect {versions['aiocollect']}; "
            f"{os.cpu_count()} CPUs, torch.set_num_threads(1), "
            f"frames_per_batch={FPB}; frames/s is the median of {st.repeats} timed runs after a "
            "warmup; first batch is the time from construction to the first batch in hand._"
        ),
    ]
    log("\nMarkdown:\n")
    log("\n".join(md))

    elapsed, load_end = time.perf_counter() - t_start, _loadavg()
    log(
        f"\ntotal time {elapsed:.1f} s; load average (1 min) {load_start:.2f} at start, "
        f"{load_end:.2f} at end (this benchmark adds about 1)"
    )
    if args.json:
        result = {
            "versions": versions,
            "load_avg": [load_start, load_end],
            "rows": table,
            "responsiveness": resp,
            "checks": [{"check": d, "ok": ok, "value": v} for d, ok, v in checks],
            "elapsed_s": elapsed,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 1 if args.strict and any_fail else 0


if __name__ == "__main__":  # the guard matters: subprocess envs re-import this module
    sys.exit(main())
