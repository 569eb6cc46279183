"""Every policy kind: None, plain nn.Module, TensorDictModule, TensorDict callables."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from tensordict.nn import (
    InteractionType,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)

from aiocollect import SyncDataCollector
from aiocollect.testing import CountingEnv


def probabilistic_actor() -> ProbabilisticTensorDictSequential:
    net = TensorDictModule(torch.nn.Linear(3, 2), in_keys=["observation"], out_keys=["logits"])
    dist = ProbabilisticTensorDictModule(
        in_keys=["logits"], out_keys=["action"], distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )  # fmt: skip
    return ProbabilisticTensorDictSequential(net, dist)


def collect(policy, **kwargs) -> TensorDict:
    with SyncDataCollector(lambda: CountingEnv(2), policy, frames_per_batch=8, total_frames=8, **kwargs) as c:
        return next(c)


def test_random_policy_actions_are_valid_and_seeded() -> None:
    def run(seed: int) -> torch.Tensor:
        with SyncDataCollector(lambda: CountingEnv(2), frames_per_batch=64, total_frames=64) as c:
            c.set_seed(seed)
            return next(c)["action"]

    a, b, other = run(1), run(1), run(2)
    assert a.dtype == torch.int64 and set(a.unique().tolist()) == {0, 1}
    assert torch.equal(a, b) and not torch.equal(a, other)


def test_tensordict_module_extra_outputs_are_stored() -> None:
    batch = collect(probabilistic_actor())
    assert batch["logits"].shape == (2, 4, 2)
    log_prob_key = next(k for k in batch.keys() if "log_prob" in str(k))
    assert batch[log_prob_key].shape == (2, 4)
    expected = torch.distributions.Categorical(logits=batch["logits"]).log_prob(batch["action"])
    torch.testing.assert_close(batch[log_prob_key], expected)


def test_exploration_type_deterministic_takes_the_mode() -> None:
    batch = collect(probabilistic_actor(), exploration_type=InteractionType.DETERMINISTIC)
    assert torch.equal(batch["action"], batch["logits"].argmax(-1))


def test_tensordict_callable_reads_and_writes_keys() -> None:
    def policy(td: TensorDict) -> TensorDict:
        td["action"] = (td["observation"][..., 2] > 1).long()
        td["my_extra"] = td["observation"].sum(-1, keepdim=True)
        return td

    batch = collect(policy)
    assert torch.equal(batch["action"], (batch["observation"][..., 2] > 1).long())
    assert batch["my_extra"].shape == (2, 4, 1)


def test_plain_module_maps_observation_to_action_without_grad() -> None:
    seen = []

    class Policy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            seen.append(torch.is_grad_enabled())
            return (self.lin(obs) > 0).long().squeeze(-1)

    batch = collect(Policy())
    assert batch["action"].shape == (2, 4)
    assert seen and not any(seen)


def test_init_random_frames_skips_the_policy_for_whole_batches() -> None:
    calls = []

    class Policy(torch.nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            calls.append(obs.shape)
            return torch.ones(obs.shape[:-1], dtype=torch.int64)

    with SyncDataCollector(lambda: CountingEnv(2), Policy(), frames_per_batch=8, total_frames=24,
                           init_random_frames=10) as c:  # fmt: skip
        batches = list(c)
    # 10 random frames round up to two whole batches of 8; only the third uses the policy.
    assert len(calls) == 4 + 1  # 4 steps + the dry run that checks the output once
    assert (batches[2]["action"] == 1).all()


def test_outputs_numpy_cannot_hold_are_stored_by_torch() -> None:
    # bfloat16 has no numpy dtype: the rollout's numpy fast path must fall back for it.
    def policy(td: TensorDict) -> TensorDict:
        td["action"] = (td["observation"][..., 2] > 1).long()
        td["half"] = td["observation"].to(torch.bfloat16)
        return td

    batch = collect(policy)
    assert batch["half"].dtype == torch.bfloat16
    assert torch.equal(batch["half"], batch["observation"].to(torch.bfloat16))


def test_bfloat16_observations_are_recorded() -> None:
    from aiocollect import ArraySpec, EnvSpec

    class HalfEnv(CountingEnv):
        def __init__(self) -> None:
            super().__init__(2, episode_length=3)
            self.spec = EnvSpec(self.spec.batch_size, observation={"observation": ArraySpec((3,), torch.bfloat16)},
                                action=self.spec.action)  # fmt: skip

        def reset(self, mask=None, seeds=None):  # type: ignore[no-untyped-def]
            td = super().reset(mask, seeds)
            return td.set("observation", td["observation"].to(torch.bfloat16))

        def step(self, action):  # type: ignore[no-untyped-def]
            td = super().step(action)
            return td.set("observation", td["observation"].to(torch.bfloat16))

    with SyncDataCollector(HalfEnv, None, frames_per_batch=8, total_frames=16) as c:
        batches = list(c)
    for b in batches:
        obs, nxt = b["observation"].float(), b["next", "observation"].float()
        assert b["observation"].dtype == torch.bfloat16
        # [i, episode, step]: every frame is one real step; after a done the row restarts at 0.
        assert torch.equal(nxt[..., 2], obs[..., 2] + 1)
        done = b["next", "done"].squeeze(-1)[:, :-1]
        assert torch.equal(obs[:, 1:, 2][done], torch.zeros(int(done.sum())))
