"""TorchRL envs and policies behave in aiocollect's collectors as in TorchRL's: the data path.

A TorchRL env is stepped with TorchRL's own step semantics (``step_and_maybe_reset`` on one
carrier TensorDict), so batches keep what only TensorDicts carry: nested groups with batch
dims of their own, lazily stacked heterogeneous envs, dynamic shapes, non-tensor entries, and
the policy's outputs as it wrote them. Private entries are dropped and the key set is
TorchRL's (aiocollect's per-frame provenance only on request). Each case runs in one process
and, where TorchRL's multi-process collectors support it, in worker processes.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("torchrl.envs")

from tensordict import LazyStackedTensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.envs import TransformedEnv
from torchrl.modules import GRUModule
from torchrl.testing.mocking_classes import (
    ContinuousActionVecMockEnv,
    CountingEnv,
    CountingEnvWithString,
    EnvWithDynamicSpec,
    HeterogeneousCountingEnv,
    HeterogeneousCountingEnvPolicy,
    NestedCountingEnv,
)

from aiocollect import MultiaSyncDataCollector, MultiSyncDataCollector, SyncDataCollector, WorkerError

pytestmark = pytest.mark.timeout(120)

PROVENANCE = {("collector", "worker_id"), ("collector", "policy_version")}


@pytest.fixture(autouse=True)
def collect_garbage() -> Iterator[None]:
    # TorchRL envs hold shared buffers in reference cycles: free them before the leak check counts.
    yield
    gc.collect()


def first_batches(make: object, *args: object, n: int = 2, **kwargs: object) -> list[TensorDictBase]:
    collector = make(*args, **kwargs)  # type: ignore[operator]
    try:
        out = []
        for batch in collector:
            out.append(batch.clone())
            if len(out) == n:
                return out
        return out
    finally:
        collector.shutdown()


class FloatIncrement(torch.nn.Module):
    """Writes a float action of shape () for an env whose spec says int of shape (1,): TorchRL passes it on."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.ones(observation.shape[:-1])


def test_policy_outputs_are_recorded_as_the_policy_wrote_them() -> None:
    policy = TensorDictModule(FloatIncrement(), in_keys=["observation"], out_keys=["action"])
    env = CountingEnv(max_steps=4)
    assert env.action_spec.dtype != torch.float32 and env.action_spec.shape == (1,)
    (batch,) = first_batches(SyncDataCollector, CountingEnv, policy, n=1, frames_per_batch=8, total_frames=8)
    assert batch["action"].dtype == torch.float32 and batch["action"].shape == (8,)  # not cast, not reshaped
    assert batch["next", "observation"].flatten().tolist()[:4] == [1, 2, 3, 4]


class Noisy(torch.nn.Module):
    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        action = torch.zeros(*observation.shape[:-1], 7)
        return action, observation.float(), observation.float() * 2


def noisy_policy() -> TensorDictModule:
    return TensorDictModule(Noisy(), in_keys=["observation"], out_keys=["action", "_noise", ("out", "_state")])


@pytest.mark.parametrize("make", [SyncDataCollector, MultiSyncDataCollector], ids=["in-process", "workers"])
def test_private_entries_of_the_policy_are_dropped(make: type) -> None:
    env_fn = ContinuousActionVecMockEnv if make is SyncDataCollector else [ContinuousActionVecMockEnv] * 2
    (batch,) = first_batches(make, env_fn, noisy_policy(), n=1, frames_per_batch=10, total_frames=10)
    keys = set(batch.keys(True, True))
    assert "action" in keys
    assert not [k for k in keys if any(part.startswith("_") for part in ((k,) if isinstance(k, str) else k))], keys


class WithLogits(torch.nn.Module):
    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((*observation.shape[:-1], 7), 0.5), torch.ones(*observation.shape[:-1], 3)


def test_random_frames_keep_the_policys_extra_outputs() -> None:
    policy = TensorDictModule(WithLogits(), in_keys=["observation"], out_keys=["action", "logits"])
    batches = first_batches(
        SyncDataCollector, ContinuousActionVecMockEnv, policy, n=3, frames_per_batch=10, total_frames=30,
        init_random_frames=10,
    )  # fmt: skip
    assert len({frozenset(b.keys(True, True)) for b in batches}) == 1  # the key set never changes mid-run
    assert (batches[0]["logits"] == 0).all()  # random frames: the policy did not run
    assert (batches[1]["logits"] == 1).all() and (batches[1]["action"] == 0.5).all()


class Unwrappable(torch.nn.Module):
    def forward(self, speed: torch.Tensor, heading: torch.Tensor) -> torch.Tensor:  # no such env entries
        return speed + heading


def test_a_policy_that_cannot_be_wrapped_fails_at_construction() -> None:
    with pytest.raises(TypeError, match=r"(?s)cannot be wrapped for this env .*trust_policy=True"):
        SyncDataCollector(ContinuousActionVecMockEnv, Unwrappable(), frames_per_batch=10, total_frames=10)
    # In a worker it is the worker's start-up error: a WorkerError that is also the TypeError.
    with pytest.raises(TypeError, match=r"^worker 0 \(pid \d+\) failed: TypeError: the policy Unwrappable") as info:
        MultiSyncDataCollector([ContinuousActionVecMockEnv], Unwrappable(), frames_per_batch=10, total_frames=10)
    assert isinstance(info.value, WorkerError) and isinstance(info.value, RuntimeError)


class Linear(torch.nn.Linear):
    def forward(self, observation: torch.Tensor, observation_orig: torch.Tensor) -> torch.Tensor:
        # Its arguments are named as the env's observation entries: TorchRL's rule can wrap it.
        return super().forward(observation)


def test_a_plain_module_is_wrapped_from_observation_to_action() -> None:
    env = ContinuousActionVecMockEnv()
    net = Linear(env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1])
    (batch,) = first_batches(SyncDataCollector, ContinuousActionVecMockEnv, net, n=1, frames_per_batch=10)
    with torch.no_grad():
        expected = net(batch["observation"], batch["observation_orig"])
    # One step's row through the layer against all ten at once: BLAS sums in another order, so
    # values near 0 differ by ~1e-7 (allclose's default atol, 1e-8, failed about once in 100 runs).
    # Read from observation_orig, the actions would be off by O(1).
    torch.testing.assert_close(batch["action"], expected, rtol=1e-5, atol=1e-5)


COLLECTORS = [SyncDataCollector, MultiSyncDataCollector, MultiaSyncDataCollector]


def env_fn(make: type, fn: object, workers: int = 2) -> object:
    return fn if make is SyncDataCollector else [fn] * workers


@pytest.mark.parametrize("make", COLLECTORS, ids=lambda c: c.__name__)
def test_nested_groups_keep_their_own_batch_dims(make: type) -> None:
    fn = functools.partial(NestedCountingEnv, max_steps=3, nested_dim=5)
    (batch,) = first_batches(make, env_fn(make, fn), None, n=1, frames_per_batch=20, total_frames=20)
    lead = tuple(batch.batch_size)
    assert batch["data"].batch_size == (*lead, 5) and batch["next", "data"].batch_size == (*lead, 5)
    assert batch.names[-1] == "time"


@pytest.mark.parametrize("make", COLLECTORS, ids=lambda c: c.__name__)
def test_heterogeneous_envs_give_lazy_stacks_of_their_own_shapes(make: type) -> None:
    env = HeterogeneousCountingEnv(max_steps=3, batch_size=(2,))
    policy = HeterogeneousCountingEnvPolicy(env.input_spec["full_action_spec"])
    fn = functools.partial(HeterogeneousCountingEnv, max_steps=3, batch_size=(2,))
    (batch,) = first_batches(make, env_fn(make, fn), policy, n=1, frames_per_batch=8, total_frames=8)
    group = batch["lazy"]  # 3 agents whose entries differ in shape: a lazy stack along the agent dim
    assert isinstance(group, LazyStackedTensorDict) and group.batch_size == (*batch.batch_size, 3)
    agents = group.unbind(-1)
    assert len({tuple(a["tensor_0"].shape) for a in agents}) > 1  # each keeps its own shape, none padded
    assert (batch["next", "lazy", "camera"] > 0).any()  # values were recorded, not placeholders


@pytest.mark.parametrize("make", [SyncDataCollector, MultiaSyncDataCollector], ids=lambda c: c.__name__)
def test_dynamic_specs_are_stacked_as_they_come(make: type) -> None:
    fn = EnvWithDynamicSpec
    batches = first_batches(make, env_fn(make, fn, 1), None, n=2, frames_per_batch=10, total_frames=20)
    for batch in batches:
        assert isinstance(batch, LazyStackedTensorDict) and batch.names[-1] == "time"
        sizes = {td["observation"].shape[-2] for td in batch.unbind(-1)}
        assert len(sizes) > 1  # the observation grows within an episode: ragged along time


@pytest.mark.parametrize("make", [SyncDataCollector, MultiSyncDataCollector], ids=lambda c: c.__name__)
def test_non_tensor_entries_reach_the_batch(make: type) -> None:
    (batch,) = first_batches(make, env_fn(make, CountingEnvWithString), None, n=1, frames_per_batch=8)
    strings = batch.get("string") if make is SyncDataCollector else batch[0].get("string")
    values = strings.tolist() if hasattr(strings, "tolist") else strings
    assert all(isinstance(s, str) and len(s) >= 4 for s in values)


def test_torchrl_batches_have_torchrls_keys_and_provenance_on_request() -> None:
    (plain,) = first_batches(SyncDataCollector, ContinuousActionVecMockEnv, None, n=1, frames_per_batch=10)
    assert not PROVENANCE & set(plain.keys(True, True))
    (tracked,) = first_batches(
        MultiSyncDataCollector, [ContinuousActionVecMockEnv] * 2, None, n=1, frames_per_batch=10,
        track_provenance=True,
    )  # fmt: skip
    assert set(tracked.keys(True, True)) - set(plain.keys(True, True)) == PROVENANCE
    assert tracked["collector", "worker_id"][:, 0].tolist() == [0, 1]
    # Other envs keep aiocollect's provenance by default, and may turn it off.
    (gym,) = first_batches(SyncDataCollector, "CartPole-v1", None, n=1, frames_per_batch=8)
    assert PROVENANCE <= set(gym.keys(True, True))
    (bare,) = first_batches(SyncDataCollector, "CartPole-v1", None, n=1, frames_per_batch=8, track_provenance=False)
    assert not PROVENANCE & set(bare.keys(True, True))


@pytest.mark.parametrize("env", ["torchrl", "gymnasium"])
def test_compact_obs_leaves_the_next_observations_out(env: str) -> None:
    fn = ContinuousActionVecMockEnv if env == "torchrl" else "CartPole-v1"
    (full,) = first_batches(SyncDataCollector, fn, None, n=1, frames_per_batch=10)
    (compact,) = first_batches(SyncDataCollector, fn, None, n=1, frames_per_batch=10, compact_obs=True)
    observations = {k for k in full.keys(True, True) if isinstance(k, str) and k.startswith("observation")}
    assert observations and {("next", k) for k in observations} <= set(full.keys(True, True))
    assert set(full.keys(True, True)) - set(compact.keys(True, True)) == {("next", k) for k in observations}
    # Each dropped entry is the root observation of the following step (unless the env was reset there).
    going_on = ~full["next", "done"][:-1].squeeze(-1)
    assert torch.equal(full["observation"][1:][going_on], full["next", "observation"][:-1][going_on])


@pytest.mark.parametrize("fn", [ContinuousActionVecMockEnv, "CartPole-v1"], ids=["torchrl", "gymnasium"])
def test_return_same_td_hands_out_one_tensordict_overwritten_in_place(fn: object) -> None:
    collector = SyncDataCollector(fn, None, frames_per_batch=10, total_frames=30, return_same_td=True)
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    assert len(batches) == 3
    first = batches[0]["action"]
    assert all(b["action"].data_ptr() == first.data_ptr() for b in batches)  # the same storage every time
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    with pytest.raises(ValueError, match=r"^return_same_td=True yields the collector's own buffers"):
        SyncDataCollector(fn, None, frames_per_batch=10, return_same_td=True,
                          replay_buffer=ReplayBuffer(storage=LazyTensorStorage(10)))  # fmt: skip


@pytest.mark.parametrize("use_buffers", [True, False])
def test_fake_tensordict_is_shaped_and_keyed_like_a_batch(use_buffers: bool) -> None:
    collector = SyncDataCollector(ContinuousActionVecMockEnv, None, frames_per_batch=10, use_buffers=use_buffers)
    try:
        fake = collector.fake_tensordict()
        real = next(iter(collector))
    finally:
        collector.shutdown()
    assert fake.batch_size == real.batch_size and fake.names == real.names
    assert set(fake.keys(True, True)) == set(real.keys(True, True))
    assert all((v == 0).all() for k, v in fake.items(True, True) if k[-1] not in ("done", "truncated"))
    with pytest.raises(NotImplementedError, match=r"envs live in worker processes"):
        with MultiSyncDataCollector([ContinuousActionVecMockEnv], None, frames_per_batch=10) as multi:
            multi.fake_tensordict()


def recurrent_policy() -> TensorDictSequential:
    gru = GRUModule(
        input_size=4, hidden_size=8, num_layers=1, in_keys=["observation", "recurrent_state", "is_init"],
        out_keys=["features", ("next", "recurrent_state")],
    )  # fmt: skip
    head = TensorDictModule(torch.nn.Linear(8, 1), in_keys=["features"], out_keys=["action"])
    return TensorDictSequential(gru, head)


def cartpole_torchrl() -> object:
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


def test_auto_register_policy_transforms_appends_warns_or_keeps_quiet() -> None:
    c = SyncDataCollector(
        cartpole_torchrl(), recurrent_policy(), frames_per_batch=10, total_frames=10,
        auto_register_policy_transforms=True, trust_policy=True,
    )  # fmt: skip
    try:
        batch = next(iter(c))
    finally:
        c.shutdown()
    assert {"is_init", "recurrent_state", ("next", "recurrent_state")} <= set(batch.keys(True, True))
    # The default says what is missing (TorchRL 0.15 flips it); the dry run then fails as TorchRL's does.
    with pytest.warns(FutureWarning, match=r"missing transforms the policy needs \(InitTracker, "):
        with pytest.raises(KeyError, match="is_init"):
            SyncDataCollector(cartpole_torchrl(), recurrent_policy(), frames_per_batch=10, total_frames=10)
    # A feed-forward policy needs none: no warning (TorchRL 0.14 warns for any module).
    ff = TensorDictModule(torch.nn.Linear(4, 1), in_keys=["observation"], out_keys=["action"])
    SyncDataCollector(cartpole_torchrl(), ff, frames_per_batch=10, total_frames=10).shutdown()


def test_track_policy_version_counts_weight_updates_in_the_batch() -> None:
    net = TensorDictModule(torch.nn.Linear(7, 7), in_keys=["observation"], out_keys=["action"])
    c = SyncDataCollector(
        ContinuousActionVecMockEnv, net, frames_per_batch=5, total_frames=15, track_policy_version=True
    )
    try:
        it = iter(c)
        first = next(it)
        c.update_policy_weights_()
        second = next(it)
    finally:
        c.shutdown()
    # TorchRL's PolicyVersion transform writes the version each step ran with into "next".
    assert (first["next", "policy_version"] == 0).all()
    assert (second["next", "policy_version"] == 1).all()


def test_a_budget_below_one_batch_collects_one_batch_with_a_warning() -> None:
    with pytest.warns(UserWarning, match=r"^total_frames \(5\) is not divisible by frames_per_batch \(10\)"):
        batches = first_batches(SyncDataCollector, ContinuousActionVecMockEnv, None, n=5, frames_per_batch=10,
                                total_frames=5)  # fmt: skip
    assert [b.numel() for b in batches] == [10]


def test_a_transformed_env_keeps_its_transforms_values() -> None:
    from torchrl.envs import StepCounter

    (batch,) = first_batches(
        SyncDataCollector, lambda: TransformedEnv(CountingEnv(max_steps=50), StepCounter(3)), None, n=1,
        frames_per_batch=7,
    )  # fmt: skip
    assert batch["next", "step_count"].flatten().tolist() == [1, 2, 3, 1, 2, 3, 1]


def test_without_traj_ids_a_torchrl_batch_has_no_collector_entry_at_all() -> None:
    (batch,) = first_batches(SyncDataCollector, CountingEnv, None, n=1, frames_per_batch=4, track_traj_ids=False)
    assert "collector" not in batch.keys()  # TorchRL's layout: not even an empty group


def test_multi_async_per_worker_frames_give_every_batch_their_sum() -> None:
    batches = first_batches(
        MultiaSyncDataCollector, [ContinuousActionVecMockEnv] * 2, None, n=3, frames_per_batch=[4, 8],
        total_frames=36,
    )  # fmt: skip
    assert [b.numel() for b in batches] == [12, 12, 12]  # TorchRL's rule, whichever worker delivered
