"""A TorchRL PPO script (TorchRL's PPO tutorial, on Pendulum-v1) with aiocollect's collector.

Everything here is TorchRL: the env and its transforms, the actor and critic, GAE, the clipped
PPO loss and the replay buffer. The one changed line is the collector's import:

    from torchrl.collectors import SyncDataCollector    # before (torchrl >= 0.14: Collector)
    from aiocollect import SyncDataCollector            # after

    python examples/torchrl_ppo.py                       # 100k frames (needs `pip install -e ".[torchrl]"`)
    python examples/torchrl_ppo.py --total-frames 2000 --frames-per-batch 1000 --num-epochs 1   # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data.replay_buffers import ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.data.replay_buffers.storages import LazyTensorStorage
from torchrl.envs import Compose, DoubleToFloat, ObservationNorm, StepCounter, TransformedEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.envs.utils import ExplorationType, check_env_specs, set_exploration_type
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from aiocollect import SyncDataCollector  # was: from torchrl.collectors import SyncDataCollector


def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    seed: int = arg(0, "seed of torch and the env")
    env_id: str = arg("Pendulum-v1", "gymnasium environment id (through torchrl's GymEnv)")
    num_cells: int = arg(64, "width of the hidden layers")
    lr: float = arg(3e-4, "Adam learning rate")
    max_grad_norm: float = arg(1.0, "gradient-norm clipping threshold")
    frames_per_batch: int = arg(1000, "frames per collected batch")
    total_frames: int = arg(100_000, "frame budget of the run (a multiple of frames_per_batch)")
    sub_batch_size: int = arg(64, "minibatch size of each PPO update")
    num_epochs: int = arg(10, "optimisation passes over each batch")
    clip_epsilon: float = arg(0.2, "PPO's clipping epsilon")
    gamma: float = arg(0.99, "discount factor")
    lmbda: float = arg(0.95, "GAE lambda")
    entropy_eps: float = arg(1e-4, "entropy bonus coefficient")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_args(args: Args) -> list[str]:
    """What makes these arguments unusable (rule, value and fix for each); empty when they are fine."""
    names = ("num_cells", "frames_per_batch", "total_frames", "sub_batch_size", "num_epochs")
    problems = [f"{_flag(n)} must be a positive int, got {getattr(args, n)}" for n in names if getattr(args, n) < 1]
    if problems:
        return problems
    if args.total_frames < args.frames_per_batch:
        problems.append(
            f"--total-frames ({args.total_frames}) must be at least --frames-per-batch ({args.frames_per_batch}): "
            "a whole batch is collected before the first update; raise --total-frames or lower --frames-per-batch"
        )
    if args.sub_batch_size > args.frames_per_batch:
        problems.append(
            f"--sub-batch-size ({args.sub_batch_size}) must not exceed --frames-per-batch ({args.frames_per_batch})"
        )
    return problems


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in dataclasses.fields(Args):
        kind = {"int": int, "float": float, "str": str}[f.type]
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default,
                            help=f.metadata["help"] + " (default: %(default)s)")  # fmt: skip
    args = Args(**vars(parser.parse_args()))
    problems = check_args(args)
    if problems:  # before anything starts: a run that could never train says so at once
        parser.error("; ".join(problems))
    return args


def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    env = TransformedEnv(
        GymEnv(args.env_id),
        Compose(ObservationNorm(in_keys=["observation"]), DoubleToFloat(), StepCounter()),
    )
    env.set_seed(args.seed)
    env.transform[0].init_stats(num_iter=200, reduce_dim=0, cat_dim=0)
    check_env_specs(env)

    n_obs, n_act, cells = env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1], args.num_cells
    actor_net = nn.Sequential(
        nn.Linear(n_obs, cells), nn.Tanh(), nn.Linear(cells, cells), nn.Tanh(),
        nn.Linear(cells, 2 * n_act), NormalParamExtractor(),
    )  # fmt: skip
    policy_module = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
        spec=env.action_spec, in_keys=["loc", "scale"], distribution_class=TanhNormal,
        distribution_kwargs={"low": env.action_spec.space.low, "high": env.action_spec.space.high},
        return_log_prob=True,
    )  # fmt: skip
    value_net = nn.Sequential(
        nn.Linear(n_obs, cells), nn.Tanh(), nn.Linear(cells, cells), nn.Tanh(), nn.Linear(cells, 1)
    )
    value_module = ValueOperator(value_net, in_keys=["observation"])

    collector = SyncDataCollector(env, policy_module, frames_per_batch=args.frames_per_batch,
                                  total_frames=args.total_frames, split_trajs=False)  # fmt: skip
    replay_buffer = ReplayBuffer(storage=LazyTensorStorage(max_size=args.frames_per_batch),
                                 sampler=SamplerWithoutReplacement())  # fmt: skip
    advantage_module = GAE(gamma=args.gamma, lmbda=args.lmbda, value_network=value_module, average_gae=True)
    loss_module = ClipPPOLoss(
        actor_network=policy_module, critic_network=value_module, clip_epsilon=args.clip_epsilon,
        entropy_bonus=bool(args.entropy_eps), entropy_coeff=args.entropy_eps, critic_coeff=1.0,
        loss_critic_type="smooth_l1",
    )  # fmt: skip
    optim = torch.optim.Adam(loss_module.parameters(), args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optim, args.total_frames // args.frames_per_batch, 0.0)

    frames, eval_return = 0, float("nan")
    for i, tensordict_data in enumerate(collector):
        for _ in range(args.num_epochs):
            advantage_module(tensordict_data)
            replay_buffer.extend(tensordict_data.reshape(-1).cpu())
            for _ in range(args.frames_per_batch // args.sub_batch_size):
                subdata = replay_buffer.sample(args.sub_batch_size)
                loss_vals = loss_module(subdata)
                loss = loss_vals["loss_objective"] + loss_vals["loss_critic"] + loss_vals["loss_entropy"]
                loss.backward()
                torch.nn.utils.clip_grad_norm_(loss_module.parameters(), args.max_grad_norm)
                optim.step()
                optim.zero_grad()
        frames += tensordict_data.numel()
        collector.update_policy_weights_()
        scheduler.step()
        if i % 10 == 0 or frames >= args.total_frames:
            with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
                eval_rollout = env.rollout(1000, policy_module)
            eval_return = eval_rollout["next", "reward"].sum().item()
            print(
                f"frames {frames:>7}  train reward {tensordict_data['next', 'reward'].mean().item():8.4f}  "
                f"eval return {eval_return:9.2f}  lr {optim.param_groups[0]['lr']:.2e}",
                flush=True,
            )
    collector.shutdown()
    print(f"finished after {frames} frames", flush=True)
    print(f"final mean return (deterministic evaluation episode) {eval_return:.2f}", flush=True)


if __name__ == "__main__":
    main(parse_args())
