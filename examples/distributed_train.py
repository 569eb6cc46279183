"""PPO on CartPole-v1 with an aiocollect.DistributedCollector (CleanRL-style, single file).

Collection runs on nodes: here two local processes (``--launcher mp``), each running an
aiocollect ``Collector`` that steps its own gymnasium vector env. This process is the trainer.
With ``sync=True`` it asks every node for its share of each batch, collected with the latest
weights, and gets them stacked as a TensorDict of shape [num_nodes, num_envs, T]. After each PPO
update ``await collector.update_policy_weights_()`` sends the weights to every node and returns
once each node has acknowledged them; every frame records the version it was collected with.

    python examples/distributed_train.py            # trains until the target return is reached
    python examples/distributed_train.py --help     # every hyperparameter
    python examples/distributed_train.py --total-frames 1024 --frames-per-batch 256 \
        --update-epochs 1                           # seconds-long smoke run

The same file trains with nodes on other machines (see docs/scaling.md). Start the trainer with
``--launcher external --master-addr <an address of this machine the nodes can reach>
--tcp-port 29500``, then on each collection machine, with RANK running from 1 to num_nodes:

    MASTER_ADDR=<that address> MASTER_PORT=29500 RANK=1 python -m aiocollect.node
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import time
from collections import deque
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
import gymnasium as gym
import torch
import torch.nn as nn
from tensordict import TensorDict
from torch.distributions import Categorical
from tqdm import tqdm

from aiocollect import DistributedCollector


# ================================================================================================
# Arguments
# ================================================================================================
def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    seed: int = arg(1, "seed of the experiment (network init, envs and action sampling)")
    num_threads: int = arg(1, "torch intra-op threads of the trainer (1 is fastest for a tiny MLP)")
    env_id: str = arg("CartPole-v1", "gymnasium environment id")
    num_nodes: int = arg(2, "collection nodes, each stepping its own vector env")
    num_envs: int = arg(4, "envs in each node's synchronous gymnasium vector env")
    frames_per_batch: int = arg(1024, "frames per batch over all nodes (a multiple of num_nodes)")
    total_frames: int = arg(512_000, "frame budget of the run (a multiple of frames_per_batch)")
    launcher: str = arg("mp", "who starts the nodes: mp (local processes), submitit, external")
    master_addr: str = arg("", "address nodes reach the trainer at (empty: the launcher's default)")
    tcp_port: int = arg(0, "port of the trainer's TCPStore, MASTER_PORT for nodes (0: any free)")
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
        "num_nodes",
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
    if args.frames_per_batch % (args.num_nodes * args.num_envs):
        problems.append(
            f"--frames-per-batch ({args.frames_per_batch}) must be a multiple of --num-nodes x --num-envs "
            f"({args.num_nodes * args.num_envs})"
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
            action = argparse.BooleanOptionalAction
            parser.add_argument(flag, default=f.default, help=f.metadata["help"], action=action)
        else:
            kind = {"int": int, "float": float, "str": str}[f.type]
            text = f.metadata["help"] + " (default: %(default)s)"
            parser.add_argument(flag, type=kind, default=f.default, help=text)
    args = Args(**vars(parser.parse_args()))
    problems = check_args(args)
    if problems:  # before anything starts: a run that could never train says so at once
        parser.error("; ".join(problems))
    return args


# ================================================================================================
# Environments: a module-level factory, pickled to each node and called there
# ================================================================================================
def make_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs, vectorization_mode="sync")


# ================================================================================================
# Networks: the actor gives the logits of pi(a|s), the critic gives V(s)
# ================================================================================================
def mlp(in_features: int, out_features: int, hidden: int, out_std: float) -> nn.Sequential:
    layers = [
        nn.Linear(in_features, hidden), nn.Tanh(),
        nn.Linear(hidden, hidden), nn.Tanh(),
        nn.Linear(hidden, out_features),
    ]  # fmt: skip
    for layer, std in zip(layers[::2], (math.sqrt(2), math.sqrt(2), out_std), strict=True):
        nn.init.orthogonal_(layer.weight, std)
        nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class Policy(nn.Module):
    """The collection policy, sampling a_t ~ pi(.|s_t), sent to every node.

    An nn.Module, so ``update_policy_weights_()`` knows which weights to send; ``forward`` takes
    one argument annotated ``TensorDict``, so it is called as a TensorDict policy and may write
    ``action_log_prob`` next to ``action``.
    """

    def __init__(self, actor: nn.Module) -> None:
        super().__init__()
        self.actor = actor  # the very module the optimizer trains

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
def ppo_update(args: Args, batch: TensorDict, actor: nn.Module, critic: nn.Module, optimizer):
    keys = ("observation", "action", "action_log_prob", "advantage", "value_target")
    data = batch.select(*keys).reshape(-1)
    minibatch_size = max(1, data.numel() // args.num_minibatches)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for _epoch in range(args.update_epochs):
        for idx in torch.randperm(data.numel()).split(minibatch_size):
            mb = data[idx]
            dist = Categorical(logits=actor(mb["observation"]))  # pi_theta(.|s_t)
            ratio = (dist.log_prob(mb["action"]) - mb["action_log_prob"]).exp()  # r_t(theta)
            adv = mb["advantage"]
            if args.norm_adv and adv.numel() > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            clipped = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = torch.max(-adv * ratio, -adv * clipped).mean()
            value = critic(mb["observation"]).squeeze(-1)  # V_theta(s_t)
            v_loss = 0.5 * (value - mb["value_target"]).pow(2).mean()
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
# Training loop: the trainer's event loop waits for the nodes; learning runs in a thread
# ================================================================================================
async def main(args: Args) -> None:
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)

    probe = gym.make(args.env_id)
    obs_dim, num_actions = probe.observation_space.shape[0], int(probe.action_space.n)
    probe.close()
    actor = mlp(obs_dim, num_actions, args.hidden_size, out_std=0.01)
    critic = mlp(obs_dim, 1, args.hidden_size, out_std=1.0)
    policy = Policy(actor)
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, eps=1e-5)

    running_return = torch.zeros(args.num_nodes * args.num_envs)  # one per env row of the batch
    finished_returns: deque = deque(maxlen=args.return_window)
    mean_return = float("nan")
    frames = 0
    policy_version = 0  # number of weight updates sent so far
    start = time.perf_counter()
    pbar = tqdm(total=args.total_frames, unit="frames", unit_scale=True, dynamic_ncols=True)

    collector = DistributedCollector(
        functools.partial(make_env, args.env_id, args.num_envs), policy,
        num_nodes=args.num_nodes, sync=True,  # every node's share of each batch, on demand
        frames_per_batch=args.frames_per_batch, total_frames=args.total_frames,
        launcher=args.launcher, master_addr=args.master_addr or None,
        tcp_port=args.tcp_port or None, num_threads=args.num_threads,
    )  # fmt: skip
    collector.set_seed(args.seed)  # each node gets its own seed stream
    async with collector:
        async for batch in collector:  # [num_nodes, num_envs, T], collected with the latest weights
            # Verified weight sync: every frame of every node was collected by the current policy.
            versions = batch["collector", "policy_version"]
            expected = f"expected policy v{policy_version}, got {versions.unique().tolist()}"
            assert (versions == policy_version).all(), expected
            if args.anneal_lr:
                progress = frames / args.total_frames
                optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - progress)
            frames += batch.numel()
            batch = batch.reshape(-1, batch.shape[-1])  # [num_nodes * num_envs, T]: a row per env
            track_returns(batch, running_return, finished_returns)
            if finished_returns:
                mean_return = sum(finished_returns) / len(finished_returns)

            # Learning is CPU-bound: run it in a thread so the event loop stays responsive.
            gamma, lmbda = args.gamma, args.gae_lambda
            await anyio.to_thread.run_sync(compute_gae, batch, critic, gamma, lmbda)
            losses = await anyio.to_thread.run_sync(ppo_update, args, batch, actor, critic, optimizer)
            await collector.update_policy_weights_()  # returns once every node applied them
            policy_version += 1

            pbar.update(batch.numel())
            fps = frames / (time.perf_counter() - start)
            pbar.set_postfix(fps=f"{fps:.0f}", ret=f"{mean_return:.1f}",
                             v_loss=f"{losses['v_loss']:.2f}", refresh=False)  # fmt: skip
            if len(finished_returns) == args.return_window and mean_return >= args.target_return:
                break
        collect_fps = collector.stats().frames_per_second
    pbar.close()

    elapsed = time.perf_counter() - start
    reached = len(finished_returns) == args.return_window and mean_return >= args.target_return
    status = f"reached target {args.target_return:g}" if reached else "stopped"
    print(f"{status} after {frames} frames in {elapsed:.1f}s ({frames / elapsed:.0f} frames/s; "
          f"collection alone {collect_fps:.0f} frames/s)")  # fmt: skip
    print(f"final mean return over last {len(finished_returns)} episodes: {mean_return:.1f}")


if __name__ == "__main__":  # required: "mp" nodes are started as processes that import this module
    anyio.run(main, parse_args())
