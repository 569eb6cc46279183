"""Weight sync as TorchRL users drive it: schemes, per-worker weights, versions, staleness, errors.

Each scheme kind must be honoured (the weights reach every worker, parameters and buffers,
acknowledged), not just accepted; values are checked in the workers' batches.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import warnings
from typing import Any

import anyio
import pytest
import torch

from aiocollect import Collector, MultiAsyncCollector, MultiSyncCollector, blocking
from aiocollect._rollout._policy import NO_ROUTE
from aiocollect.testing import CountingEnv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

schemes = pytest.importorskip("torchrl.weight_update")
VERSION = ("collector", "policy_version")
WORKER = ("collector", "worker_id")
NO_ROUTE_RE = f"^{re.escape(NO_ROUTE)}"  # TorchRL's words, kept for code that matches them


class BiasedPolicy(torch.nn.Module):
    """action = ``(obs.sum(-1) * weight + bias) > 0``, with ``bias`` a buffer, not a parameter."""

    def __init__(self, weight: float = 1.0, bias: float = 0.5) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(float(weight)))
        self.register_buffer("bias", torch.tensor(float(bias)))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return ((observation.sum(-1) * self.weight + self.bias) > 0).long()


class Unpicklable(BiasedPolicy):
    def __getstate__(self) -> Any:
        raise RuntimeError("this policy cannot be pickled")


def env() -> CountingEnv:
    return CountingEnv(2, episode_length=4)


def biased(weight: float, bias: float = 0.5) -> BiasedPolicy:
    return BiasedPolicy(weight, bias)


def make_scheme(kind: str) -> Any:
    return {"shared_mem": schemes.SharedMemWeightSyncScheme, "mp": schemes.MultiProcessWeightSyncScheme}[kind]()


def all_new(batch: Any, policy: BiasedPolicy, version: int) -> bool:
    """Every frame of ``batch`` collected by ``policy`` at ``version``."""
    return bool((batch[VERSION] == version).all()) and torch.equal(batch["action"], policy(batch["observation"]))


async def until_every_worker_is_new(c: Any, policy: BiasedPolicy, version: int, workers: int) -> set[int]:
    """Read batches until each worker delivered one collected with ``policy``; none mixes versions.

    Bounded by time, not by a count of batches: a MultiAsyncCollector yields batches as they
    arrive, and on a loaded machine one worker can deliver a dozen tiny batches while the
    other is not scheduled at all (seen once in a full suite run: 14 batches, all from one
    worker). A worker the update never reaches is still caught: it is missing when the
    deadline passes.
    """
    seen: set[int] = set()
    with anyio.move_on_after(30):
        while len(seen) < workers:
            batch = await c.__anext__()
            parts = batch.unbind(0) if batch.ndim > 2 else [batch]
            for part in parts:
                assert part[VERSION].unique().numel() == 1  # no batch mixes two versions
                if int(part[VERSION].flatten()[0]) == version:
                    assert all_new(part, policy, version)
                    seen.add(int(part[WORKER].flatten()[0]))
    return seen


# -- every scheme kind reaches every worker, parameters and buffers -------------------------------
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize("kind", ["shared_mem", "mp"])
@pytest.mark.parametrize("backend", ["inline", "subprocess"])
async def test_scheme_reaches_every_worker_params_and_buffers(cls: type, kind: str, backend: str) -> None:
    policy = BiasedPolicy(1.0, 0.5)  # acts 1 on every CountingEnv frame
    new = BiasedPolicy(0.0, -1.0)  # acts 0: needs both the parameter and the buffer
    with anyio.fail_after(90):
        async with cls(env, policy, num_workers=2, frames_per_batch=16, backend=backend,
                       weight_sync_schemes={"policy": make_scheme(kind)}) as c:  # fmt: skip
            first = await c.__anext__()
            assert (first["action"] == 1).all()
            await c.update_policy_weights_(new)
            assert c.policy_version == 1 and c.get_policy_version() == 1
            assert await until_every_worker_is_new(c, new, 1, 2) == {0, 1}


@pytest.mark.parametrize("backend", ["inline", "subprocess"])
async def test_default_sync_reads_the_constructor_policy_with_its_buffers(backend: str) -> None:
    policy = BiasedPolicy(1.0, 0.5)
    with anyio.fail_after(90):
        async with MultiSyncCollector(env, policy, num_workers=2, frames_per_batch=16, backend=backend) as c:
            await c.__anext__()
            with torch.no_grad():
                policy.weight.fill_(0.0)
                policy.bias.fill_(-1.0)
            await c.update_policy_weights_()
            batch = await c.__anext__()  # sync workers were idle: the very next batch is new
    assert all_new(batch, BiasedPolicy(0.0, -1.0), 1)


# -- per-worker weights, worker_ids, factories -----------------------------------------------------
@pytest.mark.parametrize("backend", ["inline", "subprocess"])
async def test_per_worker_weights_reach_only_their_worker(backend: str) -> None:
    factories = [functools.partial(biased, 1.0), functools.partial(biased, -1.0, -1.0)]
    with anyio.fail_after(90):
        async with MultiSyncCollector(env, num_workers=2, policy_factory=factories, frames_per_batch=16,
                                      backend=backend) as c:  # fmt: skip
            first = await c.__anext__()
            assert (first["action"][0] == 1).all() and (first["action"][1] == 0).all()
            await c.update_policy_weights_({0: BiasedPolicy(0.0, -1.0).state_dict()})
            second = await c.__anext__()
            await c.update_policy_weights_(weights={"weight": torch.tensor(0.0), "bias": torch.tensor(1.0)},
                                           worker_ids=[1])  # fmt: skip
            third = await c.__anext__()
            versions = c.state_dict()
    assert (second["action"][0] == 0).all() and (second["action"][1] == 0).all()
    assert (second[VERSION][0] == 1).all() and (second[VERSION][1] == 0).all()  # worker 1 was not updated
    assert (third["action"][1] == 1).all() and (third[VERSION][1] == 2).all()
    assert [versions[f"worker{w}"]["policy_version"] for w in (0, 1)] == [1, 2]
    assert float(versions["worker1"]["policy_state_dict"]["bias"]) == 1.0


@pytest.mark.parametrize("kind", ["shared_mem", "mp"])
async def test_factory_only_workers_take_explicit_weights_and_refuse_none(kind: str) -> None:
    with anyio.fail_after(90):
        async with MultiSyncCollector(env, num_workers=2, policy_factory=functools.partial(biased, 1.0),
                                      frames_per_batch=16, weight_sync_schemes={"policy": make_scheme(kind)},
                                      backend="subprocess") as c:  # fmt: skip
            await c.__anext__()
            with pytest.raises(RuntimeError, match=NO_ROUTE_RE):
                await c.update_policy_weights_()  # no policy here to read weights from
            assert c.policy_version == 0
            await c.update_policy_weights_(BiasedPolicy(0.0, -1.0))
            batch = await c.__anext__()
    assert all_new(batch, BiasedPolicy(0.0, -1.0), 1)


async def test_unpicklable_policy_is_a_weight_source_beside_a_factory() -> None:
    policy = Unpicklable(0.0, -1.0)  # never shipped: the factory builds the workers' policies
    with anyio.fail_after(90):
        async with MultiAsyncCollector(env, policy, num_workers=2, policy_factory=functools.partial(biased, 1.0),
                                       frames_per_batch=16, weight_sync_schemes={"policy": make_scheme("mp")},
                                       backend="subprocess") as c:  # fmt: skip
            assert (await c.__anext__())["action"].eq(1).all()
            await c.update_policy_weights_()  # read from the local policy, sent to the workers
            assert await until_every_worker_is_new(c, policy, 1, 2) == {0, 1}


def td_policy(weight: float, bias: float = 0.5) -> Any:
    from tensordict.nn import TensorDictModule

    return TensorDictModule(BiasedPolicy(weight, bias), in_keys=["observation"], out_keys=["action"])


@pytest.mark.parametrize("backend", ["inline", "subprocess"])
async def test_tensordict_weights_reach_workers_whole_and_per_worker(backend: str) -> None:
    from tensordict import TensorDict

    with anyio.fail_after(90):
        async with MultiSyncCollector(env, td_policy(1.0), num_workers=2, frames_per_batch=16, backend=backend,
                                      weight_sync_schemes={"policy": make_scheme("mp")}) as c:  # fmt: skip
            await c.update_policy_weights_(TensorDict.from_module(td_policy(0.0, -1.0)))
            both = await c.__anext__()
            await c.update_policy_weights_({1: TensorDict.from_module(td_policy(0.0, 1.0)).data})
            one = await c.__anext__()
    assert (both["action"] == 0).all() and (both[VERSION] == 1).all()
    assert (one["action"][0] == 0).all() and (one["action"][1] == 1).all() and (one[VERSION][1] == 2).all()


# -- versions --------------------------------------------------------------------------------------
async def test_no_weight_sync_scheme_ignores_updates() -> None:
    with anyio.fail_after(60):
        async with MultiSyncCollector(env, BiasedPolicy(1.0), num_workers=2, frames_per_batch=16, backend="inline",
                                      weight_sync_schemes={"policy": schemes.NoWeightSyncScheme()}) as c:  # fmt: skip
            await c.__anext__()
            await c.update_policy_weights_(BiasedPolicy(0.0, -1.0))
            batch = await c.__anext__()
            version = c.policy_version
    assert version == 0 and (batch["action"] == 1).all() and (batch[VERSION] == 0).all()


@pytest.mark.parametrize("backend", ["inline", "subprocess"])
async def test_worker_versions_and_weights_restore_from_a_state_dict(backend: str) -> None:
    with anyio.fail_after(90):
        async with MultiSyncCollector(env, BiasedPolicy(1.0), num_workers=2, frames_per_batch=16,
                                      backend=backend) as c:  # fmt: skip
            await c.update_policy_weights_(BiasedPolicy(0.0, -1.0))
            await c.update_policy_weights_({1: BiasedPolicy(0.0, 1.0)})
            saved = c.state_dict()
        assert [saved[f"worker{w}"]["policy_version"] for w in (0, 1)] == [1, 2]
        async with MultiSyncCollector(env, BiasedPolicy(1.0), num_workers=2, frames_per_batch=16,
                                      backend=backend) as restored:  # fmt: skip
            restored.load_state_dict(saved)
            batch = await restored.__anext__()
            again = restored.state_dict()
            await restored.update_policy_weights_(BiasedPolicy(1.0))
            after = await restored.__anext__()
    assert restored.policy_version == 3
    assert [again[f"worker{w}"]["policy_version"] for w in (0, 1)] == [1, 2]
    # The restored weights are in use at once: worker 0 acts 0, worker 1 acts 1.
    assert (batch["action"][0] == 0).all() and (batch["action"][1] == 1).all()
    assert (batch[VERSION][0] == 1).all() and (batch[VERSION][1] == 2).all()
    assert (after[VERSION] == 3).all() and (after["action"] == 1).all()


async def test_in_process_collector_version_restores_and_counts() -> None:
    policy = BiasedPolicy(1.0)
    with anyio.fail_after(30):
        async with Collector(env, policy, frames_per_batch=8) as c:
            await c.update_policy_weights_()
            await c.update_policy_weights_(weights_dict={"policy": BiasedPolicy(0.0, -1.0)})
            saved, version = c.state_dict(), c.policy_version
        async with Collector(env, BiasedPolicy(1.0), frames_per_batch=8) as restored:
            restored.load_state_dict(saved)
            batch = await restored.__anext__()
            await restored.update_policy_weights_(model_id="policy")
    assert version == 2 and (batch[VERSION] == 2).all() and (batch["action"] == 0).all()
    assert restored.get_policy_version() == 3


# -- staleness: an update overtakes the batches a worker queued but has not started ---------------
class GatedEnv(CountingEnv):
    """Its second step tells the test (FIFO ``entered``), then waits until the test opens FIFO ``gate``."""

    def __init__(self, directory: str) -> None:
        super().__init__(1, episode_length=1000)
        self.directory, self.calls = directory, 0

    def step(self, action: Any) -> Any:
        self.calls += 1
        if self.calls == 2:
            with open(os.path.join(self.directory, "entered"), "w") as f:
                f.write("in")
            with open(os.path.join(self.directory, "gate")) as f:
                f.read()
        return super().step(action)


@pytest.mark.parametrize("backend", ["inline", "subprocess"])
async def test_update_overtakes_the_queued_batch(backend: str, tmp_path: Any) -> None:
    os.mkfifo(tmp_path / "entered")
    os.mkfifo(tmp_path / "gate")
    no_wait = schemes.SharedMemWeightSyncScheme(sync=False)  # returns before the blocked worker can acknowledge
    with anyio.fail_after(60):
        async with MultiAsyncCollector(functools.partial(GatedEnv, str(tmp_path)), BiasedPolicy(1.0), num_workers=1,
                                       frames_per_batch=4, backend=backend,
                                       weight_sync_schemes={"policy": no_wait}) as c:  # fmt: skip
            # Both slots are asked for at once: the first batch is being collected (held at its
            # second step), the second is queued behind it.
            assert await anyio.to_thread.run_sync((tmp_path / "entered").read_text) == "in"
            await c.update_policy_weights_(BiasedPolicy(0.0, -1.0))
            await anyio.to_thread.run_sync((tmp_path / "gate").write_text, "go")
            started_before = await c.__anext__()
            queued_before = await c.__anext__()
    assert (started_before[VERSION] == 0).all() and (started_before["action"] == 1).all()
    assert all_new(queued_before, BiasedPolicy(0.0, -1.0), 1)


# -- TorchRL envs: the PolicyVersion transform in workers --------------------------------------------
def torchrl_env() -> Any:
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

    return ContinuousActionVecMockEnv()


def torchrl_policy() -> Any:
    from tensordict.nn import TensorDictModule

    return TensorDictModule(torch.nn.Linear(7, 7), in_keys=["observation"], out_keys=["action"])


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_policy_version_transform_follows_updates_and_restores_in_workers(cls: type) -> None:
    pytest.importorskip("torchrl.testing.mocking_classes")
    kwargs = {"num_workers": 2, "frames_per_batch": 20, "track_policy_version": True, "backend": "subprocess"}
    with anyio.fail_after(90):
        async with cls(torchrl_env, torchrl_policy(), **kwargs) as c:
            assert (await c.__anext__())["next", "policy_version"].eq(0).all()
            await c.update_policy_weights_()
            for _ in range(8):
                batch = await c.__anext__()
                if (batch["next", "policy_version"] == 1).all():
                    break
            assert (batch["next", "policy_version"] == 1).all()
            await c.update_policy_weights_()
            saved = c.state_dict()
        async with cls(torchrl_env, torchrl_policy(), **kwargs) as restored:
            restored.load_state_dict(saved)
            # An async worker has two batches queued from its start: they come first.
            for _ in range(5):
                batch = await restored.__anext__()
                if (batch["next", "policy_version"] == 2).all():
                    break
            versions = [restored.state_dict()[f"worker{w}"]["policy_version"] for w in (0, 1)]
    assert (batch["next", "policy_version"] == 2).all() and versions == [2, 2]


async def test_in_process_policy_version_transform_restores() -> None:
    pytest.importorskip("torchrl.testing.mocking_classes")
    with anyio.fail_after(60):
        async with Collector(torchrl_env, torchrl_policy(), frames_per_batch=5, track_policy_version=True) as c:
            await c.update_policy_weights_()
            await c.update_policy_weights_()
            saved = c.state_dict()
        async with Collector(torchrl_env, torchrl_policy(), frames_per_batch=5, track_policy_version=True) as r:
            r.load_state_dict(saved)
            batch = await r.__anext__()
    assert (batch["next", "policy_version"] == 2).all()


# -- weight_updater on the in-process collector ----------------------------------------------------
def recording_updater() -> Any:
    from torchrl.collectors import WeightUpdaterBase

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchRL warns when the class is defined

        class Recording(WeightUpdaterBase):
            def __init__(self) -> None:
                self.calls: list[Any] = []

            def _get_server_weights(self) -> Any:
                return {"weight": torch.tensor(0.0), "bias": torch.tensor(-1.0)}

            def _maybe_map_weights(self, server_weights: Any) -> Any:
                return server_weights

            def _sync_weights_with_worker(self, *, worker_id: Any = None, server_weights: Any) -> None:
                self.calls.append(worker_id)
                self.collector.policy.load_state_dict(server_weights)

            def all_worker_ids(self) -> Any:
                return None

    return Recording()


async def test_weight_updater_pushes_in_process_and_warns() -> None:
    updater = recording_updater()
    with pytest.warns(DeprecationWarning, match="weight_updater"):
        c = Collector(env, BiasedPolicy(1.0), frames_per_batch=8, weight_updater=updater)
    with anyio.fail_after(30):
        async with c:
            await c.update_policy_weights_()
            batch = await c.__anext__()
    assert updater.collector is c and updater.calls == [None]
    assert all_new(batch, BiasedPolicy(0.0, -1.0), 1)


# -- errors, before anything starts ----------------------------------------------------------------
class NotAScheme:
    pass


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector])
def test_bad_weight_sync_arguments_fail_at_construction(cls: type) -> None:
    kw: dict[str, Any] = {"frames_per_batch": 8} if cls is Collector else {"num_workers": 2, "frames_per_batch": 8}
    with pytest.raises(TypeError, match=r"^weight_sync_schemes\['policy'\] must be a TorchRL WeightSyncScheme"):
        cls(env, BiasedPolicy(), weight_sync_schemes={"policy": NotAScheme()}, **kw)
    with pytest.raises(TypeError, match=r"^weight_sync_schemes must be a dict"):
        cls(env, BiasedPolicy(), weight_sync_schemes=[schemes.SharedMemWeightSyncScheme()], **kw)
    with pytest.raises(ValueError, match=r"^weight_sync_schemes syncs the policy only \(key 'policy'\), got key"):
        cls(env, BiasedPolicy(), weight_sync_schemes={"critic": schemes.SharedMemWeightSyncScheme()}, **kw)
    with pytest.raises(NotImplementedError, match=r"^weight_sync_schemes\['policy'\] is a RPCWeightSyncScheme"):
        cls(env, BiasedPolicy(), weight_sync_schemes={"policy": schemes.RPCWeightSyncScheme()}, **kw)
    with pytest.raises(TypeError, match=r"takes weight_sync_schemes or weight_updater, not both"):
        cls(env, BiasedPolicy(), weight_sync_schemes={}, weight_updater=recording_updater(), **kw)
    with pytest.raises(TypeError, match=r"^weight_updater must be a TorchRL WeightUpdaterBase"):
        cls(env, BiasedPolicy(), weight_updater=3, **kw)


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector, MultiAsyncCollector, blocking.MultiSyncCollector])
def test_weight_recv_schemes_is_taken_as_none_and_refused_otherwise(cls: type) -> None:
    # TorchRL's receivers of weights from a parent process: nothing here would drive them.
    kw: dict[str, Any] = {"frames_per_batch": 8} if cls is Collector else {"num_workers": 2, "frames_per_batch": 8}
    with pytest.raises(
        NotImplementedError,
        match=rf"^{cls.__name__} cannot take weight_recv_schemes=\{{'policy': .*SharedMemWeightSyncScheme.*\}}: "
        r"receiving weights from a parent process needs TorchRL's scheme receivers",
    ):
        cls(env, BiasedPolicy(), weight_recv_schemes={"policy": schemes.SharedMemWeightSyncScheme()}, **kw)
    if cls is not blocking.MultiSyncCollector:  # the blocking twin would start its workers
        assert cls(env, BiasedPolicy(), weight_recv_schemes=None, **kw).policy_version == 0


def test_weight_updater_is_refused_by_worker_collectors() -> None:
    with pytest.raises(NotImplementedError, match=r"^MultiAsyncCollector cannot drive weight_updater="):
        MultiAsyncCollector(env, BiasedPolicy(), num_workers=2, frames_per_batch=8, weight_updater=recording_updater())


async def test_update_forms_that_conflict_or_name_unknown_models_raise() -> None:
    async with MultiSyncCollector(env, BiasedPolicy(), num_workers=2, frames_per_batch=8, backend="inline") as c:
        w = BiasedPolicy().state_dict()
        with pytest.raises(ValueError, match=r"takes one source of weights, got policy_or_weights and weights"):
            await c.update_policy_weights_(w, weights=w)
        with pytest.raises(ValueError, match=r"weights_dict=\) names its models itself"):
            await c.update_policy_weights_(weights_dict={"policy": w}, model_id="policy")
        with pytest.raises(KeyError, match="model 'critic' is not synced"):
            await c.update_policy_weights_(w, model_id="critic")
        with pytest.raises(KeyError, match="model 'critic' is not synced"):
            await c.update_policy_weights_(weights_dict={"critic": w})
        with pytest.raises(ValueError, match=r"per-worker weights \{worker: weights\} name their workers"):
            await c.update_policy_weights_({0: w}, worker_ids=[0])
        with pytest.raises(ValueError, match=r"per-worker weights name workers \[5\]"):
            await c.update_policy_weights_({5: w})
        with pytest.raises(ValueError, match=r"worker_ids must be in range\(2\)"):
            await c.update_policy_weights_(w, worker_ids=[2])
        with pytest.raises(KeyError, match="weights are missing entries"):
            await c.update_policy_weights_({"weight": torch.tensor(1.0)})
        assert c.policy_version == 0  # nothing was sent


def act_zero(td: Any) -> Any:
    td["action"] = torch.zeros(td.shape, dtype=torch.long)
    return td


async def test_no_route_is_torchrls_error() -> None:
    async with Collector(env, frames_per_batch=8) as c:  # random actions: no weights anywhere
        with pytest.raises(RuntimeError, match=NO_ROUTE_RE):
            await c.update_policy_weights_()
    # Workers hold pickled copies of a plain callable: nothing can reach them.
    async with MultiSyncCollector(env, act_zero, num_workers=2, frames_per_batch=8, backend="inline") as m:
        with pytest.raises(RuntimeError, match=NO_ROUTE_RE):
            await m.update_policy_weights_()
    assert c.policy_version == m.policy_version == 0


async def test_in_process_callable_is_live_so_an_update_only_moves_the_version() -> None:
    net = BiasedPolicy(1.0)

    def policy(td: Any) -> Any:  # a TensorDict callable closing over the module being trained
        td["action"] = net(td["observation"])
        return td

    async with Collector(env, policy, frames_per_batch=8) as c:
        with torch.no_grad():
            net.bias.fill_(-1000.0)
        await c.update_policy_weights_()
        batch = await c.__anext__()
    assert (batch[VERSION] == 1).all() and (batch["action"] == 0).all()


def test_device_lists_name_one_storing_device() -> None:
    c = MultiSyncCollector(env, num_workers=2, frames_per_batch=8, device=["cpu", "cpu"], storing_device=["cpu"] * 2)
    assert c._cfg.storing_device == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^storing_device must name one device for every worker"):
        MultiSyncCollector(env, num_workers=2, frames_per_batch=8, storing_device=["cpu", "meta"])


# -- the blocking twins ----------------------------------------------------------------------------
def test_blocking_twin_takes_every_form_and_reports_versions() -> None:
    factories = [functools.partial(biased, 1.0), functools.partial(biased, 1.0)]
    c = blocking.MultiSyncCollector(env, num_workers=2, policy_factory=factories, frames_per_batch=16,
                                    backend="inline", weight_sync_schemes={"policy": make_scheme("mp")})  # fmt: skip
    try:
        it = iter(c)
        next(it)
        c.update_policy_weights_(weights_dict={"policy": {1: BiasedPolicy(0.0, -1.0)}})
        batch = next(it)
        assert c.policy_version == 1 and c.get_policy_version() == 1
        assert isinstance(c._weight_sync_schemes["policy"], schemes.MultiProcessWeightSyncScheme)
    finally:
        c.shutdown()
    assert (batch["action"][0] == 1).all() and (batch["action"][1] == 0).all()
    single = blocking.Collector(env, BiasedPolicy(1.0), frames_per_batch=8)
    try:
        single.update_policy_weights_(policy=BiasedPolicy(0.0, -1.0))
        assert single.policy_version == 1 and (next(iter(single))["action"] == 0).all()
    finally:
        single.shutdown()


def test_packed_weights_are_plain_cpu_tensors() -> None:
    from aiocollect._workers._weights import flat_state, pack_state

    nested = {"module": {"weight": torch.ones(2, requires_grad=True)}}
    state = pickle.loads(pack_state(flat_state(nested)))
    assert list(state) == ["module.weight"] and not state["module.weight"].requires_grad
