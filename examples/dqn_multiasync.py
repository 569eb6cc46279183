"""DQN on CartPole-v1 fed by a background aiocollect.MultiAsyncCollector (CleanRL-style, single file).

Two worker processes step their own gymnasium vector envs with an epsilon-greedy policy and
write their batches straight into the shared storage of an `aiocollect.ReplayBuffer`, in the
background (``collector.start()``). The learner is a coroutine that awaits samples
(``batch = await rb.sample()``); the buffer's rate limiter keeps the frames sampled per frame
collected at CleanRL's ``batch_size / train_frequency``, holding back whichever side runs
ahead. Gradient steps run in a thread, so the event loop keeps serving the collector.

    python examples/dqn_multiasync.py               # trains until the target return is reached
    python examples/dqn_multiasync.py --help        # every hyperparameter
    python examples/dqn_multiasync.py --total-frames 2048 --learning-starts 512 \
        --eval-frequency 1024                       # seconds-long smoke run
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import time
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
import gymnasium as gym
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensordict import TensorDict
from tqdm import tqdm

from aiocollect import MultiAsyncCollector, ReplayBuffer


# ================================================================================================
# Arguments
# ================================================================================================
def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    seed: int = arg(1, "seed of the experiment (network init, envs, exploration and sampling)")
    num_threads: int = arg(1, "torch intra-op threads of the learner (1 is fastest for this tiny MLP)")
    env_id: str = arg("CartPole-v1", "gymnasium environment id")
    num_workers: int = arg(2, "worker processes, each stepping its own vector env")
    num_envs: int = arg(4, "envs in each worker's synchronous gymnasium vector env")
    frames_per_batch: int = arg(32, "frames per worker batch (num_envs * steps), written into the buffer at once")
    total_frames: int = arg(500_000, "frame budget of the whole run (env steps over all envs)")
    target_return: float = arg(450.0, "stop once the greedy policy's mean evaluation return reaches this")
    eval_episodes: int = arg(5, "episodes per greedy evaluation (on a local env, in a thread)")
    eval_frequency: int = arg(5_000, "collected frames between greedy evaluations")
    buffer_size: int = arg(10_000, "replay memory capacity in frames")
    learning_rate: float = arg(2.5e-4, "Adam learning rate")
    gamma: float = arg(0.99, "discount factor gamma")
    tau: float = arg(1.0, "target network update rate (1.0: hard copy)")
    target_network_frequency: int = arg(50, "gradient steps between target updates (CleanRL: 500 frames / 10)")
    batch_size: int = arg(128, "frames per sampled minibatch")
    start_e: float = arg(1.0, "initial exploration epsilon")
    end_e: float = arg(0.05, "final exploration epsilon")
    exploration_fraction: float = arg(0.1, "fraction of total_frames over which epsilon is annealed (CleanRL: 0.5)")
    learning_starts: int = arg(10_000, "frames collected (uniformly random actions) before learning starts")
    train_frequency: int = arg(10, "collected frames per gradient step: samples_per_insert = batch_size / this")
    weight_sync_frequency: int = arg(10, "gradient steps between pushes of the weights (and epsilon) to the workers")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_args(args: Args) -> list[str]:
    """What makes these arguments unusable (rule, value and fix for each); empty when they are fine."""
    names = (
        "num_workers", "num_envs", "frames_per_batch", "total_frames", "eval_episodes", "eval_frequency",
        "buffer_size", "batch_size", "train_frequency", "target_network_frequency", "weight_sync_frequency",
    )  # fmt: skip
    problems = [f"{_flag(n)} must be a positive int, got {getattr(args, n)}" for n in names if getattr(args, n) < 1]
    if problems:
        return problems
    if not 0 <= args.learning_starts < args.total_frames:
        problems.append(
            f"--learning-starts must be at least 0 and below --total-frames ({args.total_frames}), got "
            f"{args.learning_starts}: sampling waits for that many frames, so no gradient step would run; "
            "lower --learning-starts or raise --total-frames"
        )
    if args.learning_starts > args.buffer_size:
        problems.append(
            f"--learning-starts ({args.learning_starts}) must not exceed --buffer-size ({args.buffer_size}), "
            "which holds fewer frames; lower the first or raise the second"
        )
    if args.batch_size > args.buffer_size:
        problems.append(f"--batch-size ({args.batch_size}) must not exceed --buffer-size ({args.buffer_size})")
    if args.frames_per_batch % args.num_envs:
        problems.append(
            f"--frames-per-batch ({args.frames_per_batch}) must be a multiple of --num-envs ({args.num_envs})"
        )
    if args.frames_per_batch < args.train_frequency:
        # Each batch must be worth at least one minibatch of samples, or the learner's last
        # sample() could wait for frames that the spent budget will never bring.
        problems.append(
            f"--frames-per-batch ({args.frames_per_batch}) must be at least --train-frequency "
            f"({args.train_frequency}), so each batch is worth a gradient step"
        )
    for n in ("start_e", "end_e", "exploration_fraction"):
        if not 0.0 <= getattr(args, n) <= 1.0:
            problems.append(f"{_flag(n)} must be between 0 and 1, got {getattr(args, n)}")
    return problems


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float, "str": str}[f.type]
        parser.add_argument(flag, type=kind, default=f.default, help=f.metadata["help"] + " (default: %(default)s)")
    args = Args(**vars(parser.parse_args()))
    problems = check_args(args)
    if problems:  # before anything starts: a run that could never train says so at once
        parser.error("; ".join(problems))
    return args


def make_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """Each worker's env (module level, so the spawned worker processes can unpickle it)."""
    return gym.make_vec(env_id, num_envs, vectorization_mode="sync")


# ================================================================================================
# Networks: Q(s, .) and the epsilon-greedy collection policy built on it
# ================================================================================================
def q_network(obs_dim: int, num_actions: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, num_actions))


class EpsilonGreedy(nn.Module):
    """a_t = argmax_a Q(s_t, a), or a uniformly random action with probability epsilon.

    An nn.Module, so the collector lays its state dict out in shared memory and
    ``update_policy_weights_()`` pushes it to the workers. Epsilon is a registered buffer, so it
    is part of that state dict: annealing it here reaches the workers with the next push.
    """

    def __init__(self, q: nn.Module, num_actions: int, epsilon: float) -> None:
        super().__init__()
        self.q = q  # the very module the optimizer trains
        self.num_actions = num_actions
        self.register_buffer("epsilon", torch.tensor(epsilon))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        greedy = self.q(observation).argmax(-1)
        explore = torch.rand(greedy.shape) < self.epsilon
        return torch.where(explore, torch.randint_like(greedy, self.num_actions), greedy)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    return max(end_e, start_e + (end_e - start_e) * t / max(duration, 1.0))


# ================================================================================================
# One DQN gradient step (Mnih et al., 2015): regress Q(s, a) on r + gamma * max_a' Q_target(s', a')
# ================================================================================================
def dqn_step(args: Args, batch: TensorDict, q: nn.Module, target: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    with torch.no_grad():
        next_q = target(batch["next", "observation"]).max(-1).values
        # Bootstrap unless the episode *terminated*: a truncated episode (time limit) still has
        # a future, so ("next", "done") alone would be wrong here.
        not_terminal = 1.0 - batch["next", "terminated"].squeeze(-1).float()
        td_target = batch["next", "reward"].squeeze(-1) + args.gamma * next_q * not_terminal
    q_taken = q(batch["observation"]).gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
    loss = F.mse_loss(q_taken, td_target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


# ================================================================================================
# Greedy evaluation. The buffer holds frames, not episodes (and frames from both workers'
# envs interleave in it), so returns are measured the simplest honest way: play whole
# episodes with epsilon = 0 on a separate local env, in a thread.
# ================================================================================================
@torch.no_grad()
def evaluate(q: nn.Module, env: gym.Env, episodes: int) -> float:
    total = 0.0
    for _ in range(episodes):
        obs, _ = env.reset()
        done = False
        while not done:
            action = int(q(torch.as_tensor(obs, dtype=torch.float32)).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
    return total / episodes


# ================================================================================================
# Training loop: collectors in the background, an async learner in front
# ================================================================================================
async def main(args: Args) -> None:
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)

    eval_env = gym.make(args.env_id)
    eval_env.reset(seed=args.seed + 10_000)  # later resets continue this env's own RNG
    obs_dim, num_actions = eval_env.observation_space.shape[0], int(eval_env.action_space.n)
    q = q_network(obs_dim, num_actions)
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=args.learning_rate)
    policy = EpsilonGreedy(q, num_actions, args.start_e)

    samples_per_insert = args.batch_size / args.train_frequency  # CleanRL: 128 frames every 10 steps
    rb = ReplayBuffer(
        args.buffer_size, batch_size=args.batch_size, seed=args.seed,
        min_size=args.learning_starts,  # sample() waits until this many frames are written
        samples_per_insert=samples_per_insert,
        # Slack for the ratio: two batches per worker. Neither side waits on every batch.
        tolerance=samples_per_insert * args.frames_per_batch * args.num_workers * 2,
    )  # fmt: skip
    collector = MultiAsyncCollector(
        functools.partial(make_env, args.env_id, args.num_envs), policy, num_workers=args.num_workers,
        frames_per_batch=args.frames_per_batch, total_frames=args.total_frames,
        init_random_frames=args.learning_starts,  # counted on rb.write_count: random until learning starts
        replay_buffer=rb, num_threads=args.num_threads,
    )  # fmt: skip
    collector.set_seed(args.seed)

    mean_return, loss, epsilon = float("nan"), float("nan"), args.start_e
    updates, frames, next_eval = 0, 0, args.eval_frequency
    start = time.perf_counter()
    pbar = tqdm(total=args.total_frames, unit="frames", unit_scale=True, dynamic_ncols=True)
    async with collector:
        collector.start()  # workers now fill rb on their own, as fast as the rate limiter allows
        # The collector stops at total_frames; so does the learner (a rate-limited sample()
        # would otherwise wait for frames that never come).
        while rb.write_count < args.total_frames:
            batch = await rb.sample()  # waits for learning_starts frames, then for the collectors
            loss = await anyio.to_thread.run_sync(dqn_step, args, batch, q, target, optimizer)
            updates += 1
            if updates % args.target_network_frequency == 0:
                for tp, p in zip(target.parameters(), q.parameters(), strict=True):
                    tp.data.lerp_(p.data, args.tau)
            if updates % args.weight_sync_frequency == 0:
                frames = rb.write_count
                epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_frames,
                                          frames)  # fmt: skip
                policy.epsilon.fill_(epsilon)
                await collector.update_policy_weights_()  # Q-network and epsilon, to every worker
                pbar.update(frames - pbar.n)
                pbar.set_postfix(fps=f"{frames / (time.perf_counter() - start):.0f}", eval_ret=f"{mean_return:.1f}",
                                 eps=f"{epsilon:.2f}", loss=f"{loss:.3f}", refresh=False)  # fmt: skip
            if rb.write_count >= next_eval:
                next_eval = (rb.write_count // args.eval_frequency + 1) * args.eval_frequency
                mean_return = await anyio.to_thread.run_sync(evaluate, q, eval_env, args.eval_episodes)
                if mean_return >= args.target_return:
                    break
        frames = rb.write_count
        stats, collect_fps = rb.stats(), collector.stats().frames_per_second
    pbar.update(frames - pbar.n)
    pbar.close()
    if not mean_return >= args.target_return:  # budget spent: one last look at the final network
        mean_return = await anyio.to_thread.run_sync(evaluate, q, eval_env, args.eval_episodes)
    eval_env.close()

    elapsed = time.perf_counter() - start
    print(f"{updates} gradient steps; {stats.samples_per_insert:.2f} frames sampled per frame collected "
          f"(target {samples_per_insert:g}); learner waited {stats.sample_wait_seconds:.1f}s, collectors "
          f"{stats.insert_wait_seconds:.1f}s; mean age of sampled frames {stats.sampled_policy_lag_mean:.1f} "
          "policy versions")  # fmt: skip
    status = f"reached target {args.target_return:g}" if mean_return >= args.target_return else "stopped"
    print(
        f"{status} after {frames} frames in {elapsed:.1f}s ({frames / elapsed:.0f} frames/s; "
        f"collection alone {collect_fps:.0f} frames/s)"
    )
    print(f"final mean return over {args.eval_episodes} greedy evaluation episodes: {mean_return:.1f}")


if __name__ == "__main__":  # required: worker processes are spawned and re-import this module
    anyio.run(main, parse_args())
