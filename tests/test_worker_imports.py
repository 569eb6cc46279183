"""The worker-side path runs on torch, numpy and gymnasium alone: it never imports tensordict.

Each check runs in a fresh interpreter (``sys.executable``, hard timeout), because the test
process itself has long imported tensordict. The child builds what a worker builds (a
validated config, ``make_env``, a `PolicyAdapter`, a `Rollout`), collects two batches into
preallocated tensors with `Rollout.collect_into` and then asserts that ``"tensordict"`` is
still absent from ``sys.modules``.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import aiocollect

ROOT = Path(aiocollect.__file__).resolve().parents[1]  # the checkout under test

WORKER_MODULES = [
    "aiocollect._rollout._config",
    "aiocollect._rollout._policy",
    "aiocollect._rollout._rollout",
    "aiocollect._core._seeding",
    "aiocollect._core._shm",
    "aiocollect._buffer._storage",
    "aiocollect._envs._gym",
    "aiocollect._envs._gym_spaces",
    "aiocollect._envs._base",
    "aiocollect._envs._specs",
    "aiocollect._core._errors",
]

# Builds and runs a rollout the way a worker does; ``POLICY`` and ``CONFIG`` are filled in.
CHILD = """
import math, os, pickle, sys, threading
import torch
{imports}
from aiocollect._rollout._config import make_env, validate_config
from aiocollect._rollout._policy import PolicyAdapter
from aiocollect._rollout._rollout import Rollout, TrajCounter
from aiocollect._core._seeding import SeedPlan
from aiocollect._core._shm import SharedBlock, layout_nbytes
from aiocollect._buffer._storage import attach_storage
import numpy as np


class Argmax(torch.nn.Module):
    def forward(self, x):
        return x.argmax(-1)


assert aiocollect.__file__.startswith({root!r}), aiocollect.__file__
cfg = {config}
env = make_env(cfg)
policy = {policy}
adapter = PolicyAdapter(policy, policy_device=cfg.policy_device, exploration_type=cfg.exploration_type)
adapter.bind(env.spec)
generator = torch.Generator()
rollout = Rollout(
    env, adapter, steps=math.ceil(cfg.frames_per_batch / max(1, env.spec.numel)),
    traj_counter=TrajCounter(0, 1), generator=generator,
    max_frames_per_traj=cfg.max_frames_per_traj, set_truncated=cfg.set_truncated,
    reset_at_each_iter=cfg.reset_at_each_iter, env_device=cfg.env_device, storing_device=None,
    track_traj_ids=cfg.track_traj_ids, stop=threading.Event(), worker_id=3,
)
plan = SeedPlan(np.random.SeedSequence(0))
plan.apply_rngs(generator)
rollout.request_reset(plan.env_seeds(max(1, env.spec.numel)))
rollout.prepare()
layout = rollout.output_layout()
# The batch lands in shared memory mapped the way a worker maps a replay buffer's storage.
block = SharedBlock(layout_nbytes(layout))
owner = block.views(layout)
out = attach_storage(("shared", block.size, layout), os.dup(block.fd))
frames = []
for _ in range(2):
    steps = rollout.collect_into(False, out)
    assert steps == rollout.T, steps
    frames.append({{k: v.clone() for k, v in owner.items()}})
env.close()
a, b = frames
T = rollout.T
for batch in frames:
    assert batch["observation"].shape == (T, 4), batch["observation"].shape
    assert set(batch["action"].unique().tolist()) <= {{0, 1}}
    assert bool((batch[("collector", "worker_id")] == 3).all())
    assert bool((batch[("collector", "policy_version")] == 0).all())
    # Within a trajectory, each observation is the previous step's next observation.
    same = batch[("collector", "traj_ids")][1:] == batch[("collector", "traj_ids")][:-1]
    assert torch.equal(batch["observation"][1:][same], batch[("next", "observation")][:-1][same])
    done = batch[("next", "done")].squeeze(-1)
    assert torch.equal(done, batch[("next", "terminated")].squeeze(-1) | batch[("next", "truncated")].squeeze(-1))
# The second batch continues the first.
if not bool(a[("next", "done")][-1]):
    assert torch.equal(b["observation"][0], a[("next", "observation")][-1])
    assert int(b[("collector", "traj_ids")][0]) == int(a[("collector", "traj_ids")][-1])
loaded = sorted(m for m in sys.modules if m == "tensordict" or m.startswith("tensordict."))
assert not loaded, f"the worker path imported {{loaded[:5]}}"
print("OK", int(a[("next", "done")].sum() + b[("next", "done")].sum()))
"""

VALIDATED = """validate_config(
    create_env_fn="CartPole-v1", policy={policy_arg}, frames_per_batch=64, total_frames=-1,
    max_frames_per_traj=None, init_random_frames=None, reset_at_each_iter=False, postproc=None,
    split_trajs=None, exploration_type="random", reset_when_done=True, device=None,
    env_device=None, policy_device=None, storing_device=None, create_env_kwargs=None,
    set_truncated=False, track_traj_ids=True, max_queued_batches=0, shutdown_timeout=10.0,
)"""

MLP = "torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2), Argmax())"


def run_child(code: str, *args: str) -> str:
    """Run ``code`` in a fresh interpreter on this checkout; return its stdout (raise on failure)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def child(policy: str, config: str, imports: str = "") -> str:
    imports = imports or "import aiocollect\n" + "\n".join(f"import {m}" for m in WORKER_MODULES)
    return textwrap.dedent(CHILD).format(imports=imports, root=str(ROOT), policy=policy, config=config)


def test_worker_modules_import_without_tensordict() -> None:
    code = "import sys\n" + "\n".join(f"import {m}" for m in WORKER_MODULES) + "\n"
    code += "assert 'tensordict' not in sys.modules, sorted(m for m in sys.modules if 'tensordict' in m)[:5]\n"
    run_child(code)


@pytest.mark.parametrize("policy", [MLP, "None"], ids=["mlp", "random"])
def test_worker_rollout_collects_without_tensordict(policy: str) -> None:
    config = VALIDATED.format(policy_arg=policy)
    out = run_child(child(policy, config))
    assert out.startswith("OK")


def test_pickled_config_unpickles_without_tensordict() -> None:
    # The parent validates (tensordict is loaded here, and InteractionType is passed); the
    # child only unpickles, as a worker does.
    from tensordict.nn import InteractionType

    from aiocollect._rollout._config import validate_config

    cfg = validate_config(
        create_env_fn="CartPole-v1", policy=None, frames_per_batch=64, total_frames=-1,
        max_frames_per_traj=None, init_random_frames=None, reset_at_each_iter=False, postproc=None,
        split_trajs=None, exploration_type=InteractionType.MODE, reset_when_done=True, device=None,
        env_device=None, policy_device=None, storing_device=None, create_env_kwargs=None,
        set_truncated=False, track_traj_ids=True, max_queued_batches=0, shutdown_timeout=10.0,
    )  # fmt: skip
    assert type(cfg.exploration_type) is str and cfg.exploration_type == "mode"
    config = f"pickle.loads({pickle.dumps(cfg)!r})"
    out = run_child(child(MLP, config))
    assert out.startswith("OK")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("random", "random"), ("MODE", "mode"), ("Deterministic", "deterministic")],
)
def test_exploration_type_is_stored_as_plain_str(value: str, expected: str) -> None:
    from tensordict.nn import InteractionType

    from aiocollect._rollout._config import check_exploration_type

    got = check_exploration_type(value)
    assert type(got) is str and got == expected
    got = check_exploration_type(InteractionType(expected))
    assert type(got) is str and got == expected


def test_tensordict_module_policy_still_runs_in_process() -> None:
    from tensordict.nn import InteractionType, TensorDictModule, TensorDictSequential

    from aiocollect._rollout._config import make_env, validate_config
    from aiocollect._rollout._policy import PolicyAdapter
    from aiocollect._rollout._rollout import Rollout, TrajCounter

    cfg = validate_config(
        create_env_fn="CartPole-v1", policy=None, frames_per_batch=16, total_frames=-1,
        max_frames_per_traj=None, init_random_frames=None, reset_at_each_iter=False, postproc=None,
        split_trajs=None, exploration_type=InteractionType.DETERMINISTIC, reset_when_done=True,
        device=None, env_device=None, policy_device=None, storing_device=None, create_env_kwargs=None,
        set_truncated=False, track_traj_ids=True, max_queued_batches=0, shutdown_timeout=10.0,
    )  # fmt: skip
    net = torch.nn.Sequential(torch.nn.Linear(4, 2))
    seen: list[str] = []

    def forward(logits: torch.Tensor) -> torch.Tensor:
        from tensordict.nn.probabilistic import interaction_type

        seen.append(str(interaction_type()))
        return logits.argmax(-1)

    td_policy = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
    pick = TensorDictModule(forward, in_keys=["logits"], out_keys=["action"])
    policy = TensorDictSequential(td_policy, pick)
    env = make_env(cfg)
    try:
        adapter = PolicyAdapter(policy, policy_device=None, exploration_type=cfg.exploration_type)
        adapter.bind(env.spec)
        rollout = Rollout(
            env, adapter, steps=16, traj_counter=TrajCounter(), generator=torch.Generator(),
            max_frames_per_traj=None, set_truncated=False, reset_at_each_iter=False, env_device=None,
            storing_device=None, track_traj_ids=True, stop=threading.Event(),
        )  # fmt: skip
        rollout.prepare()
        out = {k: torch.empty(s, dtype=d) for k, s, d in rollout.output_layout()}
        assert rollout.collect_into(False, out) == 16
        assert torch.equal(out["action"], out["logits"].argmax(-1))
        assert seen and set(seen) == {str(InteractionType.DETERMINISTIC)}
        batch = rollout.collect(False)  # the TensorDict form still works
        assert batch.batch_size == (16,) and batch.names == ["time"]
        assert torch.equal(batch["action"], batch["logits"].argmax(-1))
    finally:
        env.close()


def test_collect_into_a_preempted_batch_marks_the_missing_steps() -> None:
    from aiocollect._rollout._policy import PolicyAdapter
    from aiocollect._rollout._rollout import Rollout, TrajCounter
    from aiocollect.testing import CountingEnv

    env = CountingEnv(2, episode_length=4)
    adapter = PolicyAdapter(None, policy_device=None, exploration_type="random")
    adapter.bind(env.spec)
    rollout = Rollout(
        env, adapter, steps=6, traj_counter=TrajCounter(), generator=torch.Generator().manual_seed(0),
        max_frames_per_traj=None, set_truncated=False, reset_at_each_iter=False, env_device=None,
        storing_device=None, track_traj_ids=True, stop=threading.Event(), worker_id=1,
    )  # fmt: skip
    rollout.prepare()
    out = {k: torch.full(s, 7, dtype=d) for k, s, d in rollout.output_layout()}
    polls = iter(range(100))
    # Polled before every step but the first (TorchRL's rule: a preempted batch takes one step).
    assert rollout.collect_into(True, out, preempt=lambda: next(polls) >= 2) == 3
    assert next(polls) == 3  # polls before steps 1, 2 and 3: none before step 0
    assert rollout.collect_into(True, dict(out), preempt=lambda: True) == 1  # preempted at once: one step
    assert rollout.collect_into(True, out, preempt=lambda: next(polls) >= 6) == 3
    assert torch.equal(out["observation"][:, :3, 2], torch.tensor([[0.0, 1, 2], [0, 1, 2]]))
    assert bool((out["observation"][:, 3:] == 0).all()) and bool((out["action"][:, 3:] == 0).all())
    assert bool((out[("collector", "traj_ids")][:, 3:] == -1).all())
    assert out[("collector", "policy_version")].tolist() == [[0, 0, 0, -1, -1, -1]] * 2
    assert bool((out[("collector", "worker_id")][:, :3] == 1).all())
    # The next batch carries on from where the preempted one stopped.
    assert rollout.collect_into(True, out) == 6
    assert out["observation"][:, 0, 2].tolist() == [3.0, 3.0]
