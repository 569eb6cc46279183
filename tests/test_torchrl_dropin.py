"""The TorchRL drop-in: TorchRL envs, policies and replay buffers in aiocollect's collectors.

A TorchRL script changes only its import line. The batch checks run TorchRL's own collector
beside aiocollect's on the same env, policy and seed, and compare every entry.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Iterator

import anyio
import pytest
import torch

pytest.importorskip("torchrl.envs")

# Imported here, not first inside a test: the module keeps the exception of its optional
# `import gym` for ever, and with it the frames of whichever call imported it first (a
# collector's, which would then never be freed, nor the TorchRL buffer it writes into).
import torchrl.envs.libs.utils  # noqa: F401
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector as TorchRLCollector
from torchrl.collectors import MultiSyncCollector as TorchRLMultiSync
from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictPrioritizedReplayBuffer, TensorDictReplayBuffer
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvCreator,
    GymEnv,
    InitTracker,
    ObservationNorm,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
)

import aiocollect
from aiocollect import MultiaSyncDataCollector, MultiSyncDataCollector, SyncDataCollector

pytestmark = pytest.mark.timeout(120)

#: What aiocollect adds to a TorchRL env's batches with track_provenance=True (nothing by default).
PROVENANCE = {("collector", "worker_id"), ("collector", "policy_version")}


def pendulum(seed: int | None = None, max_steps: int = 7) -> TransformedEnv:
    # max_steps well below the batch length: every batch holds resets (truncations).
    env = TransformedEnv(
        GymEnv("Pendulum-v1"),
        Compose(
            DoubleToFloat(),
            StepCounter(max_steps),
            RewardSum(),
            InitTracker(),
            ObservationNorm(loc=0.5, scale=2.0, in_keys=["observation"]),
        ),
    )
    if seed is not None:
        env.set_seed(seed)
    return env


def two_pendulums(seed: int) -> SerialEnv:
    env = SerialEnv(2, pendulum)
    env.set_seed(seed)
    return env


class Deterministic(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)
        with torch.no_grad():
            self.net.weight.copy_(torch.tensor([[0.3, -0.2, 0.1]]))
            self.net.bias.fill_(0.05)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).tanh() * 2


def policy() -> TensorDictModule:
    return TensorDictModule(Deterministic(), in_keys=["observation"], out_keys=["action"])


def leaves(td: TensorDict) -> set:
    return set(td.keys(True, True))


def assert_same_batches(ours: list[TensorDict], theirs: list[TensorDict], *, traj_ids_exact: bool = True) -> None:
    assert len(ours) == len(theirs) >= 3
    for i, (a, t) in enumerate(zip(ours, theirs, strict=True)):
        assert a.shape == t.shape, i
        assert leaves(a) == leaves(t), i  # exactly TorchRL's keys
        assert a.names == t.names, i
        for key in sorted(leaves(t), key=str):
            if key == ("collector", "traj_ids") and not traj_ids_exact:
                continue
            x, y = a.get(key), t.get(key)
            assert (x.shape, x.dtype) == (y.shape, y.dtype), (i, key)
            assert torch.equal(x, y), (i, key)
    # The batches held resets (truncations by StepCounter), so the reset path was compared too.
    assert any(bool(t["next", "truncated"].any()) for t in theirs)


def collect(make: object, env: object, n_batches: int = 4, frames: int = 40, pol: object = None) -> list[TensorDict]:
    pol = policy() if pol is None else pol
    collector = make(env, pol, frames_per_batch=frames, total_frames=frames * n_batches)
    try:
        return [batch.clone() for batch in collector]
    finally:
        collector.shutdown()


class Recurrent:
    """An LSTM policy and the env it needs (InitTracker, and a primer for its state), built once."""

    def __init__(self) -> None:
        from tensordict.nn import TensorDictSequential
        from torchrl.modules import LSTMModule

        torch.manual_seed(0)
        self.lstm = LSTMModule(input_size=3, hidden_size=8, in_key="observation", out_key="embed")
        head = TensorDictModule(torch.nn.Linear(8, 1), in_keys=["embed"], out_keys=["action"])
        self.policy = TensorDictSequential(self.lstm, head)

    def env(self) -> TransformedEnv:
        env = TransformedEnv(GymEnv("Pendulum-v1"), Compose(StepCounter(7), InitTracker(),
                                                            self.lstm.make_tensordict_primer()))  # fmt: skip
        env.set_seed(0)
        return env


RECURRENT = Recurrent()
ENV_FNS = {
    "GymEnv+transforms": functools.partial(pendulum, 0),
    "SerialEnv": functools.partial(two_pendulums, 0),
    "LSTM policy": RECURRENT.env,
}
POLICIES = {"LSTM policy": RECURRENT.policy}
MULTI_FNS = [functools.partial(pendulum, 0), functools.partial(pendulum, 1)]


@pytest.fixture(scope="module")
def torchrl_batches() -> dict[str, list[TensorDict]]:
    """TorchRL's own batches, collected once before any test's leak snapshot.

    TorchRL's collectors keep process-wide helpers (multiprocessing's fd-passing thread, a
    few descriptors) for the rest of the process: they are the reference's, not leaks of
    the aiocollect code under test.
    """
    out = {name: collect(TorchRLCollector, fn(), pol=POLICIES.get(name)) for name, fn in ENV_FNS.items()}
    out["multi"] = collect(TorchRLMultiSync, MULTI_FNS, n_batches=3)
    gc.collect()
    return out


@pytest.fixture(autouse=True)
def collect_garbage() -> Iterator[None]:
    # A TorchRL replay buffer owns multiprocessing semaphores (in /dev/shm) that its
    # finalizer frees; collect it before the leak check looks (this runs first at teardown).
    yield
    gc.collect()


@pytest.mark.parametrize("name", list(ENV_FNS))
def test_sync_collector_gives_torchrl_batches_value_for_value(name: str, torchrl_batches: dict) -> None:
    ours = collect(SyncDataCollector, ENV_FNS[name](), pol=POLICIES.get(name))
    assert_same_batches(ours, torchrl_batches[name])
    if name == "SerialEnv":
        assert ours[0].shape == (2, 20)
    if name == "LSTM policy":
        # The policy's next state goes through the env into "next" and on to the next step's
        # root, and starts again from zeros after each reset (InitTracker's is_init).
        b = ours[0]
        assert {"recurrent_state_h", ("next", "recurrent_state_h"), "is_init"} <= leaves(b)
        torch.testing.assert_close(b["recurrent_state_h"][1:6], b["next", "recurrent_state_h"][:5])
        starts = b["is_init"].squeeze(-1)
        assert bool(starts[7]) and not bool(b["recurrent_state_h"][7].any())


def same_partition(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two id tensors group the same frames together (equal up to renaming the ids)."""
    pairs = set(zip(a.flatten().tolist(), b.flatten().tolist(), strict=True))
    return len({x for x, _ in pairs}) == len({y for _, y in pairs}) == len(pairs)


def test_multi_sync_collector_gives_torchrl_batches_value_for_value(torchrl_batches: dict) -> None:
    theirs = torchrl_batches["multi"]
    ours = collect(MultiSyncDataCollector, MULTI_FNS, n_batches=3)
    # TorchRL numbers trajectories from a counter the workers share (first come, first
    # served); aiocollect's ids do not depend on timing. They must group the same frames.
    assert_same_batches(ours, theirs, traj_ids_exact=False)
    for a, t in zip(ours, theirs, strict=True):
        assert same_partition(a["collector", "traj_ids"], t["collector", "traj_ids"])
    all_ids = torch.cat([a["collector", "traj_ids"].flatten() for a in ours])
    assert len(set(all_ids.tolist())) == len(
        set(torch.cat([t["collector", "traj_ids"].flatten() for t in theirs]).tolist())
    )


def test_workers_rebuild_envs_from_an_env_creator_and_keep_torchrl_keys() -> None:
    with MultiSyncDataCollector(
        [EnvCreator(pendulum)] * 2, None, frames_per_batch=40, total_frames=80, track_provenance=True
    ) as c:
        batches = list(c)
    assert [b.shape for b in batches] == [(2, 20), (2, 20)]
    b = batches[0]
    assert {"step_count", "episode_reward", "is_init", ("next", "step_count")} <= leaves(b)
    assert b["next", "reward"].shape == (2, 20, 1) and b["action"].shape == (2, 20, 1)
    # Random actions come from the env's action spec: Pendulum's torque is in [-2, 2].
    assert bool((b["action"].abs() <= 2).all())
    assert sorted(b["collector", "worker_id"][:, 0].tolist()) == [0, 1]  # asked for: track_provenance=True
    assert (b["collector", "policy_version"] == 0).all()


def test_the_collector_writes_step_count_only_when_the_env_does_not() -> None:
    with pytest.raises(ValueError, match="step_count"):
        with SyncDataCollector(pendulum(), None, frames_per_batch=10, total_frames=10, max_frames_per_traj=5) as c:
            next(iter(c))


@pytest.mark.anyio
async def test_async_collector_steps_a_torchrl_env_off_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    seen: set[int] = set()

    class Recording(Deterministic):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            seen.add(threading.get_ident())
            return super().forward(obs)

    pol = TensorDictModule(Recording(), in_keys=["observation"], out_keys=["action"])
    async with aiocollect.Collector(pendulum(0), pol, frames_per_batch=20, total_frames=60) as c:
        shapes = [b.shape async for b in c]
    assert shapes == [(20,)] * 3
    assert seen and loop_thread not in seen


class RecordingBuffer(TensorDictReplayBuffer):
    """A TorchRL buffer that remembers which threads extended it."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.extend_threads: set[int] = set()

    def extend(self, data: TensorDict, *args: object, **kwargs: object) -> torch.Tensor:
        self.extend_threads.add(threading.get_ident())
        return super().extend(data, *args, **kwargs)


def make_pendulum() -> TransformedEnv:
    return pendulum()


class Watched:
    """Mixed into a TorchRL buffer: `wait_len` waits for the collector's writes (no polling)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.written = threading.Condition()

    def extend(self, data: TensorDict, *args: object, **kwargs: object) -> torch.Tensor:
        out = super().extend(data, *args, **kwargs)
        with self.written:
            self.written.notify_all()
        return out

    def wait_len(self, n: int) -> None:
        with self.written:
            assert self.written.wait_for(lambda: len(self) >= n, timeout=60), f"{len(self)} frames, not {n}"


class WatchedReplayBuffer(Watched, ReplayBuffer):
    pass


class WatchedTensorDictReplayBuffer(Watched, TensorDictReplayBuffer):
    pass


def background_collector(kind: str, rb: object) -> object:
    """The seeds' background pattern: 400 frames of random actions into ``rb``, in batches of 50."""
    if kind == "sync":
        return SyncDataCollector(make_pendulum, None, frames_per_batch=50, total_frames=400, replay_buffer=rb)
    return MultiaSyncDataCollector([make_pendulum] * 2, None, frames_per_batch=50, total_frames=400, replay_buffer=rb)


@pytest.mark.parametrize("kind", ["sync", "multi-async"])
@pytest.mark.parametrize("buffer_cls", [WatchedReplayBuffer, WatchedTensorDictReplayBuffer])
def test_seeds_background_pattern_fills_a_torchrl_buffer(kind: str, buffer_cls: type) -> None:
    rb = buffer_cls(storage=LazyTensorStorage(1_000), batch_size=16)
    collector = background_collector(kind, rb)
    collector.start()
    rb.wait_len(16)
    samples = [rb.sample() for _ in range(5)]  # TorchRL's own sample(), while collection goes on
    rb.wait_len(400)
    collector.async_shutdown()
    assert len(rb) == 400  # every frame, once
    assert all(s.shape == (16,) and s["next", "reward"].shape == (16, 1) for s in samples)
    assert not collector.is_running()


def _segment_trees_missing() -> str | None:
    """Why TorchRL's prioritized buffers cannot run here, or None if they can."""
    from torchrl.data import TensorDictPrioritizedReplayBuffer

    try:
        rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(4))
        rb.extend(TensorDict({"x": torch.zeros(2)}, batch_size=[2]))
    except (ImportError, RuntimeError) as exc:
        return f"TorchRL's C++ segment trees do not load next to this torch ({exc})"
    return None


class WatchedPrioritizedReplayBuffer(Watched, TensorDictPrioritizedReplayBuffer):
    pass


@pytest.mark.parametrize("kind", ["sync", "multi-async"])
def test_background_collection_into_a_torchrl_prioritized_buffer(kind: str) -> None:
    # torchrl 0.14.1's wheel is built against torch 2.14: its segment trees load only there.
    why = _segment_trees_missing()
    if why is not None:
        pytest.skip(why)
    rb = WatchedPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(1_000), batch_size=16)
    collector = background_collector(kind, rb)
    collector.start()
    rb.wait_len(16)
    sample = rb.sample()  # TorchRL's prioritized sample, while collection goes on
    assert {"index", "priority_weight"} <= set(sample.keys()) and sample.shape == (16,)
    sample.set("td_error", torch.arange(16, dtype=torch.float32) + 1)
    rb.update_tensordict_priority(sample)  # the learner's priority update, during collection
    rb.wait_len(400)
    collector.async_shutdown()
    assert len(rb) == 400  # every frame, once
    assert not collector.is_running()


def test_torchrl_buffer_writes_happen_off_the_event_loop_and_errors_reach_async_shutdown() -> None:
    rb = RecordingBuffer(storage=LazyTensorStorage(1_000), batch_size=4)
    calls = 0

    def failing(obs: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls > 35:
            raise RuntimeError("policy blew up")
        return torch.zeros(1)

    pol = TensorDictModule(failing, in_keys=["observation"], out_keys=["action"])

    async def main() -> None:
        async with aiocollect.Collector(pendulum(), pol, frames_per_batch=10, total_frames=100, replay_buffer=rb) as c:
            loop_thread = threading.get_ident()
            c.start()
            with anyio.fail_after(30):
                await c.wait_finished()  # the policy's failure ends background collection
            assert not c.is_running()
            with pytest.raises(RuntimeError, match="policy blew up"):
                await c.async_shutdown()
        assert rb.extend_threads and loop_thread not in rb.extend_threads
        assert len(rb) >= 10 and len(rb) % 10 == 0  # the whole batches before the failure, nothing torn

    anyio.run(main)


def make_gym_pendulum() -> GymEnv:
    return GymEnv("Pendulum-v1")


@pytest.fixture(scope="module")
def parallel_env_process_state() -> None:
    """Run one TorchRL ParallelEnv before the leak snapshot of the test that uses one.

    The first ParallelEnv of a process leaves torch's shared-memory file descriptors open
    for the rest of the process (a fixed set, reused by every later one).
    """
    from torchrl.envs import ParallelEnv

    env = ParallelEnv(4, make_gym_pendulum)
    env.rollout(3)
    env.close()
    del env
    gc.collect()


@pytest.mark.usefixtures("parallel_env_process_state")
def test_seeds_quick_example_runs_unchanged_on_a_parallel_env() -> None:
    from tensordict.nn import NormalParamExtractor, TensorDictSequential
    from torchrl.envs import ParallelEnv
    from torchrl.modules import MLP, ProbabilisticActor, TanhNormal

    net = TensorDictSequential(
        TensorDictModule(MLP(out_features=2, num_cells=[16]), ["observation"], ["param"]),
        TensorDictModule(NormalParamExtractor(), ["param"], ["loc", "scale"]),
    )
    actor = ProbabilisticActor(net, in_keys=["loc", "scale"], distribution_class=TanhNormal, return_log_prob=True)
    # The seeds' example, at 2 batches instead of 50.
    collector = SyncDataCollector(
        ParallelEnv(4, make_gym_pendulum), policy=actor, frames_per_batch=200, total_frames=400
    )
    shapes = []
    for data in collector:
        shapes.append(tuple(data.shape))
        assert data["action"].shape == (4, 50, 1) and bool((data["action"].abs() <= 2).all())
        assert data["action_log_prob"].shape == (4, 50)
    collector.shutdown()
    assert shapes == [(4, 50), (4, 50)]


def test_qvalue_actor_with_an_egreedy_module_stepped_between_batches() -> None:
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import EGreedyModule, QValueActor

    env = GymEnv("CartPole-v1")
    spec = env.action_spec
    qnet = QValueActor(torch.nn.Linear(4, 2), in_keys=["observation"], spec=spec)
    egreedy = EGreedyModule(spec, eps_init=1.0, eps_end=0.0, annealing_num_steps=64)
    actor = TensorDictSequential(qnet, egreedy)
    eps = []
    with SyncDataCollector(env, actor, frames_per_batch=32, total_frames=96) as c:
        for batch in c:
            eps.append(float(egreedy.eps))
            egreedy.step(batch.numel())  # the user's call between batches, as with TorchRL
            assert batch["action"].shape == (32, 2) and bool((batch["action"].sum(-1) == 1).all())
            assert {"action_value", "chosen_action_value"} <= set(batch.keys())
    assert eps == [1.0, 0.5, 0.0]  # the collector runs the very module the user anneals
