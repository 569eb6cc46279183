"""TorchRL's weight-sync arguments on the node collectors (torch.distributed, Ray, RPC).

TorchRL's distributed collectors take ``weight_sync_schemes``, ``weight_updater`` and
``weight_recv_schemes``, and their ``update_policy_weights_`` takes ``policy=``,
``worker_ids=``, ``model_id=`` and ``weights_dict=``: a script written for them must run
unchanged. The argument checks build the async classes, which start nothing in their
constructor; the others run two local nodes (``launcher="mp"``). `test_ray.py` and
`test_rpc.py` run each collector's own scheme on its own transport.
"""

from __future__ import annotations

import warnings

import anyio
import pytest
from _node_envs import check_update_forms, scripted
from _weight_policies import HangsWhenLoading
from tensordict.nn import TensorDictModule

from aiocollect import DistributedCollector, DistributedSyncCollector, RayCollector, RPCCollector, blocking
from aiocollect.testing import CountingEnv

schemes = pytest.importorskip("torchrl.weight_update")

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

VERSION = ("collector", "policy_version")
NATIVE = [
    (DistributedCollector, schemes.DistributedWeightSyncScheme),
    (DistributedSyncCollector, schemes.DistributedWeightSyncScheme),
    (RayCollector, schemes.RayWeightSyncScheme),
    (RPCCollector, schemes.RPCWeightSyncScheme),
]
IDS = [cls.__name__ for cls, _ in NATIVE]


def counting() -> CountingEnv:
    return CountingEnv(1, episode_length=7)


def kw(**extra: object) -> dict[str, object]:
    return {"launcher": "mp", "shutdown_timeout": 5.0, **extra}


def build(cls: type, **extra: object) -> object:
    return cls([counting] * 2, scripted(1.0), frames_per_batch=20, **extra)


@pytest.mark.parametrize(("cls", "scheme"), NATIVE, ids=IDS)
def test_the_collectors_own_scheme_is_its_default_and_is_taken(cls: type, scheme: type) -> None:
    # TorchRL's attribute names the scheme the collector syncs with, given or by default.
    assert isinstance(build(cls)._weight_sync_schemes["policy"], scheme)
    given = scheme()
    assert build(cls, weight_sync_schemes={"policy": given})._weight_sync_schemes == {"policy": given}
    assert build(cls, weight_sync_schemes=None, weight_updater=None, weight_recv_schemes=None) is not None


@pytest.mark.parametrize(("cls", "scheme"), NATIVE, ids=IDS)
def test_other_schemes_updaters_and_receivers_are_refused_with_the_fix(cls: type, scheme: type) -> None:
    name = cls.__name__
    for other in (schemes.SharedMemWeightSyncScheme(), schemes.MultiProcessWeightSyncScheme()):
        with pytest.raises(
            NotImplementedError,
            match=rf"^weight_sync_schemes\['policy'\] is a {type(other).__name__}, whose transport {name} cannot "
            rf"honour; pass {scheme.__name__}\(\) or NoWeightSyncScheme\(\) \(or none\)$",
        ):
            build(cls, weight_sync_schemes={"policy": other})
    with pytest.raises(ValueError, match=r"^weight_sync_schemes syncs the policy only \(key 'policy'\), got key"):
        build(cls, weight_sync_schemes={"critic": scheme()})
    from torchrl.collectors import VanillaWeightUpdater

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        updater = VanillaWeightUpdater(policy_weights=scripted(1.0).state_dict())
    with pytest.raises(
        NotImplementedError,
        match=rf"^{name} cannot drive weight_updater=.*"
        rf"or pass weight_sync_schemes=\{{'policy': {scheme.__name__}\(\)\}}$",
    ):
        build(cls, weight_updater=updater)
    with pytest.raises(
        NotImplementedError,
        match=rf"^{name} cannot take weight_recv_schemes=\{{'policy': .*\}}: receiving weights from a parent process "
        r"needs TorchRL's scheme receivers, .*; drop it and send weights with update_policy_weights_\(\)$",
    ):
        build(cls, weight_recv_schemes={"policy": scheme()})


async def test_per_node_weights_are_refused_before_anything_is_sent() -> None:
    c = build(DistributedCollector, **kw())
    try:
        with pytest.raises(
            ValueError,
            match=r"^DistributedCollector sends one set of weights per update, got weights for nodes \[0, 1\]: call "
            r"update_policy_weights_\(weights, worker_ids=node\) for each$",
        ):
            await c.update_policy_weights_({0: scripted(-1.0).state_dict(), 1: scripted(-1.0).state_dict()})
        with pytest.raises(ValueError, match=r"^worker_ids must be in range\(2\), got \[2\]"):
            await c.update_policy_weights_(worker_ids=[2])
        assert c.policy_version == 0
    finally:
        await c.aclose()


async def test_torchrls_update_forms_reach_the_nodes_they_name() -> None:
    await check_update_forms(DistributedCollector, schemes.DistributedWeightSyncScheme(), **kw())


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_no_weight_sync_scheme_makes_every_update_do_nothing(sync: bool) -> None:
    # update_after_each_batch sends weights before each batch (sync) or to the node that
    # delivered one (async): neither may reach a node, nor may an explicit update.
    policy = scripted(1.0)
    with anyio.fail_after(90):
        async with DistributedCollector(
            [counting] * 2, policy, frames_per_batch=20, total_frames=-1, sync=sync, update_after_each_batch=True,
            weight_sync_schemes={"policy": schemes.NoWeightSyncScheme()}, **kw(),
        ) as c:  # fmt: skip
            await c.__anext__()
            await c.update_policy_weights_(scripted(-1.0))
            policy.module.weight.data.fill_(-1.0)  # what update_after_each_batch would send
            after = [await c.__anext__() for _ in range(4)]
            assert c.policy_version == 0
    for batch in after:
        assert (batch[VERSION] == 0).all()
        assert set(batch["action"][batch["observation"][..., 2] > 0].tolist()) == {1}


async def test_a_scheme_with_sync_false_returns_without_waiting_for_the_nodes() -> None:
    # Both nodes hang loading the update: with sync=False the call returns at once (by default
    # it waits weight_sync_timeout and names them, test_distributed.py checks).
    policy = TensorDictModule(HangsWhenLoading(), ["observation"], ["action"])
    with anyio.fail_after(60):
        async with DistributedCollector(
            [counting] * 2, policy, frames_per_batch=10, total_frames=-1, sync=True, worker_timeout=None,
            weight_sync_timeout=30.0, weight_sync_schemes={"policy": schemes.DistributedWeightSyncScheme(sync=False)},
            **kw(),
        ) as c:  # fmt: skip
            await c.__anext__()
            with anyio.fail_after(10):
                await c.update_policy_weights_()
            assert c.policy_version == 1


def test_the_blocking_twin_takes_torchrls_keywords() -> None:
    # A TorchRL script, its import line changed (the module's timeout bounds it).
    collector = blocking.DistributedCollector(
        [counting] * 2, scripted(1.0), frames_per_batch=20, total_frames=60, sync=True,
        weight_sync_schemes={"policy": schemes.DistributedWeightSyncScheme(backend="gloo")}, **kw(),
    )  # fmt: skip
    try:
        versions = []
        for i, batch in enumerate(collector):
            versions.append(int(batch[VERSION].max()))
            collector.update_policy_weights_(policy=scripted(-1.0 - i), worker_ids=[0, 1])
    finally:
        collector.shutdown()
    assert versions == [0, 1, 2]


def test_the_blocking_twin_syncs_policies_the_nodes_build_from_the_first_weights() -> None:
    # TorchRL's lazy weight sync, as its own test_ray_collector_policy_constructor writes it:
    # no policy here, weights from TensorDict.from_module, updates inside the loop.
    from functools import partial

    from tensordict import TensorDict

    collector = blocking.DistributedCollector(
        [counting] * 2, policy_factory=partial(scripted, 1.0), frames_per_batch=20, total_frames=60, sync=True, **kw()
    )
    weights = TensorDict.from_module(scripted(-1.0))
    try:
        collector.update_policy_weights_(weights)
        seen = []
        for data in collector:
            seen.append(set(data["action"][data["observation"][..., 2] > 0].tolist()))
            collector.update_policy_weights_(weights)
    finally:
        collector.shutdown()
    assert seen == [{0}, {0}, {0}]
