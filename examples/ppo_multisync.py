"""PPO on CartPole-v1 with a blocking aiocollect.MultiSyncDataCollector (CleanRL-style, single file).

Two worker processes each step their own gymnasium vector env; every batch stacks both
workers' rollouts as a TensorDict of shape [num_workers, num_envs, T]. There is no asyncio in
this file: the blocking twin runs the async collector behind the scenes. After each PPO update
``collector.update_policy_weights_()`` copies the new weights into shared memory and returns
once every worker has applied them; each frame records the version it was collected with.

    python examples/ppo_multisync.py                # trains until the target return is reached
    python examples/ppo_multisync.py --help         # every hyperparameter
    python examples/ppo_multisync.py --total-frames 1024 --frames-per-batch 256 \
        --update-epochs 1                           # seconds-long smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import time
from collections import deque
from dataclasses import dataclass, field

import gymnasium as gym
import torch
import torch.nn as nn
from tensordict import TensorDict
from torch.distributions import Categorical
from tqdm import tqdm

from aiocollect import MultiSyncDataCollector


# ================================================================================================
# Arguments
# ================================================================================================
def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    seed: int = arg(1, "seed of the experiment (network init, envs and action sampling)")
    num_threads: int = arg(1, "torch intra-op threads of the learner (1 is fastest for this tiny MLP)")
    env_id: str = arg("CartPole-v1", "gymnasium environment id")
    num_workers: int = arg(2, "worker processes, each stepping its own vector env")
    num_envs: int = arg(4, "envs in each worker's synchronous gymnasium vector env")
    frames_per_batch: int = arg(1024, "frames per batch over all workers (num_workers * num_envs * T)")
    total_frames: int = arg(512_000, "frame budget of the whole run (a multiple of frames_per_batch)")
    target_return: float = arg(450.0, "stop once the mean return of the last episodes reaches this")
    return_window: int = arg(20, "number of most recent episodes the mean return is taken over")
    learning_rate: float = arg(1e-3, "Adam learning rate")
    anneal_lr: bool = arg(True, "anneal the learning rate linearly to 0 over total_frames")
    gamma: float = arg(0.99, "discount factor gamma")
    gae_lambda: float = arg(0.95, "lambda of generalized advantage estimation")
    update_epochs: int = arg(4, "PPO epochs over each batch")
    num_minibatches: int = arg(4, "minibatches per epoch")
    norm_adv: bool = arg(True, "normalize advantages within each minibatch")
    clip_coef: float = arg(0.2, "surrogate clipping coefficient epsilon")
    ent_coef: float = arg(0.0, "entropy bonus coefficient")
    vf_coef: float = arg(0.5, "value-loss coefficient")
    max_grad_norm: float = arg(0.5, "global gradient-norm clipping threshold")
    hidden_size: int = arg(64, "width of the two hidden layers of actor and critic")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_args(args: Args) -> list[str]:
    """What makes these arguments unusable (rule, value and fix for each); empty when they are fine."""
    names = (
        "num_workers",
        "num_envs",
        "frames_per_batch",
        "total_frames",
        "update_epochs",
        "num_minibatches",
        "return_window",
        "hidden_size",
    )
    problems = [f"{_flag(n)} must be a positive int, got {getattr(args, n)}" for n in names if getattr(args, n) < 1]
    if problems:
        return problems
    if args.total_frames < args.frames_per_batch:
        problems.append(
            f"--total-frames ({args.total_frames}) must be at least --frames-per-batch ({args.frames_per_batch}): "
            "a whole batch is collected before the first update; raise --total-frames or lower --frames-per-batch"
        )
    if args.frames_per_batch % (args.num_workers * args.num_envs):
        problems.append(
            f"--frames-per-batch ({args.frames_per_batch}) must be a multiple of --num-workers x --num-envs "
            f"({args.num_workers * args.num_envs})"
        )
    if args.num_minibatches > args.frames_per_batch:
        problems.append(
            f"--num-minibatches ({args.num_minibatches}) must not exceed --frames-per-batch ({args.frames_per_batch})"
        )
    return problems


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, default=f.default, help=f.metadata["help"], action=argparse.BooleanOptionalAction)
        else:
            kind = {"int": int, "float": float, "str": str}[f.type]
            parser.add_argument(flag, type=kind, default=f.default, help=f.metadata["help"] + " (default: %(default)s)")
    args = Args(**vars(parser.parse_args()))
    problems = check_args(args)
    if problems:  # before anything starts: a run that could never train says so at once
        parser.error("; ".join(problems))
    return args


# ================================================================================================
# Environments: a module-level factory, pickled to each worker process and called there
# ================================================================================================
def make_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs, vectorization_mode="sync")


# ================================================================================================
# Networks: the actor gives the logits of pi(a|s), the critic gives V(s)
# ================================================================================================
def mlp(in_features: int, out_features: int, hidden: int, out_std: float) -> nn.Sequential:
    layers = [
        nn.Linear(in_features, hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, out_features),
    ]
    for layer, std in zip(layers[::2], (math.sqrt(2), math.sqrt(2), out_std), strict=True):
        nn.init.orthogonal_(layer.weight, std)
        nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class Policy(nn.Module):
    """The collection policy, sampling a_t ~ pi(.|s_t).

    An nn.Module, so the collector can lay its weights out in shared memory and push updates;
    ``forward`` takes one argument annotated ``TensorDict``, so it is called as a TensorDict
    policy and may write ``action_log_prob`` next to ``action``.
    """

    def __init__(self, actor: nn.Module) -> None:
        super().__init__()
        self.actor = actor  # the very module the optimizer trains: no copy to keep in sync

    def forward(self, td: TensorDict) -> TensorDict:
        dist = Categorical(logits=self.actor(td["observation"]))
        td["action"] = dist.sample()
        td["action_log_prob"] = dist.log_prob(td["action"])  # stored in the batch for the ratio
        return td


# ================================================================================================
# Generalized advantage estimation (Schulman et al., 2016), by hand
# ================================================================================================
@torch.no_grad()
def compute_gae(batch: TensorDict, critic: nn.Module, gamma: float, lmbda: float) -> TensorDict:
    """Write "advantage" A_t and "value_target" R_t = A_t + V(s_t) into a [rows, T] batch."""
    value = critic(batch["observation"]).squeeze(-1)  # V(s_t)
    next_value = critic(batch["next", "observation"]).squeeze(-1)  # V(s_{t+1}), a real next state
    reward = batch["next", "reward"].squeeze(-1)
    terminated = batch["next", "terminated"].squeeze(-1).float()  # no bootstrap past a terminal
    done = batch["next", "done"].squeeze(-1).float()  # terminated or truncated: the trace stops
    delta = reward + gamma * next_value * (1.0 - terminated) - value  # TD error delta_t
    advantage = torch.zeros_like(delta)
    running = torch.zeros_like(delta[:, 0])
    for t in reversed(range(delta.shape[-1])):  # A_t = delta_t + gamma * lambda * A_{t+1}
        running = delta[:, t] + gamma * lmbda * (1.0 - done[:, t]) * running
        advantage[:, t] = running
    batch["advantage"] = advantage
    batch["value_target"] = advantage + value
    return batch


# ================================================================================================
# PPO update: clipped surrogate objective (Schulman et al., 2017)
# ================================================================================================
def ppo_update(
    args: Args, batch: TensorDict, actor: nn.Module, critic: nn.Module, optimizer: torch.optim.Optimizer
) -> dict:
    data = batch.select("observation", "action", "action_log_prob", "advantage", "value_target").reshape(-1)
    minibatch_size = max(1, data.numel() // args.num_minibatches)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for _epoch in range(args.update_epochs):
        for idx in torch.randperm(data.numel()).split(minibatch_size):
            mb = data[idx]
            dist = Categorical(logits=actor(mb["observation"]))  # pi_theta(.|s_t)
            log_ratio = dist.log_prob(mb["action"]) - mb["action_log_prob"]
            ratio = log_ratio.exp()  # r_t(theta)
            adv = mb["advantage"]
            if args.norm_adv and adv.numel() > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
            v_loss = 0.5 * (critic(mb["observation"]).squeeze(-1) - mb["value_target"]).pow(2).mean()
            entropy = dist.entropy().mean()
            loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss

            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            optimizer.step()
    return {"pg_loss": pg_loss.item(), "v_loss": v_loss.item(), "entropy": entropy.item()}


# ================================================================================================
# Episode bookkeeping: returns of completed episodes, carried across batches per env row
# ================================================================================================
def track_returns(batch: TensorDict, running_return: torch.Tensor, finished: deque) -> None:
    reward = batch["next", "reward"].squeeze(-1)
    done = batch["next", "done"].squeeze(-1)
    for t in range(reward.shape[-1]):
        running_return += reward[:, t]
        finished.extend(running_return[done[:, t]].tolist())
        running_return[done[:, t]] = 0.0


# ================================================================================================
# Training loop (plain blocking code: no event loop in sight)
# ================================================================================================
def main(args: Args) -> None:
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)

    probe = gym.make(args.env_id)
    obs_dim, num_actions = probe.observation_space.shape[0], int(probe.action_space.n)
    probe.close()
    actor = mlp(obs_dim, num_actions, args.hidden_size, out_std=0.01)
    critic = mlp(obs_dim, 1, args.hidden_size, out_std=1.0)
    policy = Policy(actor)
    optimizer = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=args.learning_rate, eps=1e-5)

    running_return = torch.zeros(args.num_workers * args.num_envs)  # one per env row of the batch
    finished_returns: deque = deque(maxlen=args.return_window)
    mean_return = float("nan")
    frames = 0
    policy_version = 0  # number of weight updates pushed so far
    start = time.perf_counter()
    pbar = tqdm(total=args.total_frames, unit="frames", unit_scale=True, dynamic_ncols=True)

    collector = MultiSyncDataCollector(
        functools.partial(make_env, args.env_id, args.num_envs), policy, num_workers=args.num_workers,
        frames_per_batch=args.frames_per_batch, total_frames=args.total_frames, num_threads=args.num_threads,
    )  # fmt: skip
    collector.set_seed(args.seed)
    with collector:
        for batch in collector:  # [num_workers, num_envs, T], collected on demand with the latest weights
            # Verified weight sync: every frame of every worker was collected by the current policy.
            versions = batch["collector", "policy_version"]
            assert (versions == policy_version).all(), (
                f"expected policy v{policy_version}, got {versions.unique().tolist()}"
            )
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - frames / args.total_frames)
            frames += batch.numel()
            batch = batch.reshape(-1, batch.shape[-1])  # [num_workers * num_envs, T]: one row per env
            track_returns(batch, running_return, finished_returns)
            if finished_returns:
                mean_return = sum(finished_returns) / len(finished_returns)

            compute_gae(batch, critic, args.gamma, args.gae_lambda)
            losses = ppo_update(args, batch, actor, critic, optimizer)
            collector.update_policy_weights_()  # returns once every worker applied the new weights
            policy_version += 1

            pbar.update(batch.numel())
            pbar.set_postfix(fps=f"{frames / (time.perf_counter() - start):.0f}", ret=f"{mean_return:.1f}",
                             v_loss=f"{losses['v_loss']:.2f}", refresh=False)  # fmt: skip
            if len(finished_returns) == args.return_window and mean_return >= args.target_return:
                break
        collect_fps = collector.stats().frames_per_second
    pbar.close()

    elapsed = time.perf_counter() - start
    reached = len(finished_returns) == args.return_window and mean_return >= args.target_return
    status = f"reached target {args.target_return:g}" if reached else "stopped"
    print(
        f"{status} after {frames} frames in {elapsed:.1f}s ({frames / elapsed:.0f} frames/s; "
        f"collection alone {collect_fps:.0f} frames/s)"
    )
    print(f"final mean return over last {len(finished_returns)} episodes: {mean_return:.1f}")


if __name__ == "__main__":  # required: worker processes are spawned and re-import this module
    main(parse_args())
