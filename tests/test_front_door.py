"""``Collector(...)`` as TorchRL 0.14's front door: ``backend``, ``num_collectors``, ``sync``, ``backend_options``.

Every scenario runs twice: through ``aiocollect.Collector`` (which builds aiocollect's async
classes) and through ``aiocollect.blocking.Collector`` (``SyncDataCollector``, which builds
their blocking twins). Which class gets which arguments is checked with stand-in classes put
in the public module the front door reads its targets from. The real async classes are built
too (an async collector spawns nothing until used; a blocking twin starts its workers in its
constructor), and one batch is collected through the process backend, async and blocking.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import aiocollect
import aiocollect.blocking
from aiocollect.testing import CountingEnv

pytestmark = pytest.mark.timeout(60)

SELECTORS = ("backend", "backend_options", "num_collectors", "sync")
TARGETS = ("MultiSyncCollector", "MultiAsyncCollector", "RayCollector", "RPCCollector", "DistributedCollector")


@pytest.fixture(params=["async", "blocking"])
def api(request: pytest.FixtureRequest) -> types.ModuleType:
    """The public module whose ``Collector`` is under test, and whose classes it builds."""
    return aiocollect if request.param == "async" else aiocollect.blocking


def _close(collector: Any) -> None:
    if isinstance(collector, aiocollect.DataCollectorBase):
        collector.shutdown()
    else:
        anyio.run(collector.aclose)


def _first_batch(collector: Any) -> Any:
    """The first batch of a direct collector, blocking or async, which is then closed."""
    if isinstance(collector, aiocollect.DataCollectorBase):
        with collector:
            return next(collector)

    async def first() -> Any:
        async with collector:
            return await collector.__anext__()

    return anyio.run(first)


class Calls:
    """What the stand-in classes were called with: ``calls[name]`` lists ``(args, kwargs)``."""

    def __init__(self) -> None:
        self.by_class: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {name: [] for name in TARGETS}

    def only(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        """The one call made, as ``(class name, args, kwargs)``."""
        made = [(name, *call) for name, calls in self.by_class.items() for call in calls]
        assert len(made) == 1, made
        return made[0]


@pytest.fixture
def calls(api: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Replace every class the front door may build with a stand-in that records its call."""
    record = Calls()
    for name in TARGETS:

        def __init__(self: Any, *args: Any, _name: str = name, **kwargs: Any) -> None:
            record.by_class[_name].append((args, kwargs))

        monkeypatch.setattr(api, name, type(name, (), {"__init__": __init__}))
    yield record


def _torchrl() -> Any:
    return pytest.importorskip("torchrl")


# -- the signature ------------------------------------------------------------------------------
def test_signature_shows_the_selectors_and_keeps_every_argument(api: types.ModuleType) -> None:
    params = inspect.signature(api.Collector).parameters
    assert "self" not in params
    for name in SELECTORS:
        assert params[name].default is None and params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert list(params)[:2] == ["create_env_fn", "policy"]
    init = inspect.signature(aiocollect.Collector.__init__).parameters
    assert [n for n in params if n not in SELECTORS] == [n for n in init if n != "self"]


def test_subclasses_neither_dispatch_nor_show_the_selectors(api: types.ModuleType) -> None:
    class Mine(api.Collector):  # type: ignore[misc, name-defined]
        """A user's subclass."""

    assert not set(SELECTORS) & set(inspect.signature(Mine).parameters)
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_collectors'"):
        Mine(CountingEnv, num_collectors=2, frames_per_batch=4)
    mine = Mine(CountingEnv, frames_per_batch=4)
    try:
        assert type(mine) is Mine
    finally:
        _close(mine)


# -- which class, with which arguments ----------------------------------------------------------
@pytest.mark.parametrize(
    ("selectors", "name"),
    [
        ({"num_collectors": 2}, "MultiAsyncCollector"),
        ({"num_collectors": 2, "sync": True}, "MultiSyncCollector"),
        ({"backend": "process", "num_collectors": 2}, "MultiAsyncCollector"),
        ({"backend": "multiprocessing", "num_collectors": 2, "sync": True}, "MultiSyncCollector"),
        ({"backend": "ray", "num_collectors": 2}, "RayCollector"),
        ({"backend": "rpc", "num_collectors": 2}, "RPCCollector"),
        ({"backend": "distributed", "num_collectors": 2}, "DistributedCollector"),
        ({"backend": "submitit", "num_collectors": 2}, "DistributedCollector"),
    ],
)
def test_selectors_pick_the_class_and_replicate_the_env_factory(
    api: types.ModuleType, calls: Calls, selectors: dict[str, Any], name: str
) -> None:
    api.Collector(CountingEnv, None, frames_per_batch=8, total_frames=16, **selectors)
    built, args, kwargs = calls.only()
    assert built == name
    assert args == ([CountingEnv, CountingEnv], None)
    assert kwargs["frames_per_batch"] == 8 and kwargs["total_frames"] == 16
    assert not {"backend", "backend_options"} & set(kwargs)
    if name.startswith("Multi"):  # the class itself says sync; the list says how many workers
        assert not {"sync", "num_collectors", "num_workers"} & set(kwargs)
    else:
        assert kwargs["sync"] is selectors.get("sync", False)
    assert ("num_collectors" in kwargs) is (name == "RayCollector")
    if name == "RayCollector":
        assert kwargs["num_collectors"] == 2
    if selectors.get("backend") == "submitit":
        assert kwargs["launcher"] == "submitit"


def test_a_list_of_factories_sets_the_number_of_collectors(api: types.ModuleType, calls: Calls) -> None:
    api.Collector(create_env_fn=(CountingEnv, CountingEnv, CountingEnv), backend="ray", frames_per_batch=6)
    built, args, kwargs = calls.only()
    assert (built, args) == ("RayCollector", ())
    assert kwargs["create_env_fn"] == [CountingEnv] * 3 and kwargs["num_collectors"] == 3


def test_backend_options_are_merged_and_the_callers_dict_is_left_alone(api: types.ModuleType, calls: Calls) -> None:
    options = {"launcher": "mp", "remote_configs": {"num_cpus": 1}}
    api.Collector(CountingEnv, backend="distributed", backend_options=options, num_collectors=2, frames_per_batch=8)
    _, _, kwargs = calls.only()
    assert kwargs["launcher"] == "mp" and kwargs["remote_configs"] == {"num_cpus": 1}
    assert options == {"launcher": "mp", "remote_configs": {"num_cpus": 1}}


def test_a_default_the_target_does_not_share_is_left_to_the_target(
    api: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A config that spells out every Collector default (TorchRL's structured configs do) must
    # not override the chosen class's own defaults, nor pass arguments it does not take.
    seen: list[dict[str, Any]] = []

    class Target:
        def __init__(
            self, create_env_fn: Any, *, frames_per_batch: int, total_frames: int = -1, split_trajs: bool = False,
            max_frames_per_traj: int = -1, sync: bool = False, num_collectors: int | None = None,
        ) -> None:  # fmt: skip
            seen.append({"frames_per_batch": frames_per_batch, "total_frames": total_frames,
                         "split_trajs": split_trajs, "max_frames_per_traj": max_frames_per_traj})  # fmt: skip

    monkeypatch.setattr(api, "RayCollector", Target)
    generic = {"total_frames": -1, "split_trajs": None, "max_frames_per_traj": None, "extend_buffer": True}
    api.Collector(CountingEnv, backend="ray", frames_per_batch=4, **generic)
    api.Collector(CountingEnv, backend="ray", frames_per_batch=4, total_frames=8, max_frames_per_traj=3)
    assert seen == [
        {"frames_per_batch": 4, "total_frames": -1, "split_trajs": False, "max_frames_per_traj": -1},
        {"frames_per_batch": 4, "total_frames": 8, "split_trajs": False, "max_frames_per_traj": 3},
    ]


@pytest.mark.parametrize(
    ("selectors", "name"),
    [
        ({"num_collectors": 2, "sync": True}, "MultiSyncCollector"),
        ({"backend": "process"}, "MultiAsyncCollector"),
        ({"backend": "ray", "num_collectors": 2}, "RayCollector"),
        ({"backend": "rpc", "num_collectors": 2, "backend_options": {"launcher": "mp"}}, "RPCCollector"),
        (
            {"backend": "distributed", "num_collectors": 2, "backend_options": {"launcher": "mp"}},
            "DistributedCollector",
        ),
        ({"backend": "submitit", "num_collectors": 2}, "DistributedCollector"),
    ],
)
def test_the_real_async_class_is_built_and_keeps_its_type(selectors: dict[str, Any], name: str) -> None:
    # An async collector spawns nothing until it is used (the no_leaks fixture checks), so the
    # real classes can be built here; a blocking twin starts its workers, nodes or actors in
    # its constructor, so the blocking front door is checked with stand-ins above and, for the
    # process backend, by collecting below. A config spelling out every Collector default
    # (including arguments the chosen class does not take) is accepted.
    if name == "RayCollector":
        pytest.importorskip("ray")
    defaults = {"extend_buffer": True, "trajs_per_batch": None, "create_env_kwargs": None, "split_trajs": None}
    collector = aiocollect.Collector(CountingEnv, frames_per_batch=8, **defaults, **selectors)
    try:
        assert type(collector) is getattr(aiocollect, name)
        assert not isinstance(collector, aiocollect.Collector)
    finally:
        _close(collector)


def test_ray_takes_a_local_replay_buffer(api: types.ModuleType, calls: Calls) -> None:
    # aiocollect's RayCollector extends the trainer's buffer with each batch (nothing is shared
    # with the actors), so the front door passes on what RayCollector accepts, unlike TorchRL.
    rb = aiocollect.blocking.ReplayBuffer(64)
    try:
        api.Collector(CountingEnv, backend="ray", replay_buffer=rb, frames_per_batch=8)
        built, _, kwargs = calls.only()
        assert built == "RayCollector" and kwargs["replay_buffer"] is rb
    finally:
        rb.close()


def test_the_real_ray_collector_takes_a_local_replay_buffer() -> None:
    pytest.importorskip("ray")
    rb = aiocollect.ReplayBuffer(64)
    collector = aiocollect.Collector(CountingEnv, backend="ray", replay_buffer=rb, frames_per_batch=8)
    try:
        assert type(collector) is aiocollect.RayCollector
    finally:
        _close(collector)
        rb.close_now()


# -- the direct backend ------------------------------------------------------------------------
def test_direct_unwraps_a_list_of_one_factory(api: types.ModuleType) -> None:
    env = CountingEnv(2)
    collector = api.Collector([lambda: env], backend="direct", num_collectors=1, frames_per_batch=4, total_frames=4)
    assert type(collector) is api.Collector
    assert _first_batch(collector).shape == (2, 2)
    assert env.closed


def test_explicit_direct_wins_over_an_enclosing_service_backend(api: types.ModuleType, calls: Calls) -> None:
    torchrl = _torchrl()
    with torchrl.service_backend("ray"):
        collector = api.Collector(CountingEnv, backend="direct", frames_per_batch=4)
    try:
        assert type(collector) is api.Collector
        # The blocking twin's async collector is the direct one too, not the context's choice.
        assert type(getattr(collector, "_async", collector)) is aiocollect.Collector
        assert calls.by_class == {name: [] for name in TARGETS}
    finally:
        _close(collector)


@pytest.mark.parametrize(("context", "name"), [("rpc", "RPCCollector"), ("process", "MultiAsyncCollector")])
def test_an_enclosing_service_backend_picks_the_class(
    api: types.ModuleType, calls: Calls, context: str, name: str
) -> None:
    torchrl = _torchrl()
    with torchrl.service_backend(context):
        api.Collector(CountingEnv, frames_per_batch=4)
    built, args, _ = calls.only()
    assert (built, args[0]) == (name, [CountingEnv])
    # Outside the block the default is direct again.
    collector = api.Collector(CountingEnv, frames_per_batch=4)
    try:
        assert type(collector) is api.Collector
    finally:
        _close(collector)


# -- errors, all raised before anything is built -----------------------------------------------
_CHOICES = "direct, distributed, multiprocessing, process, ray, rpc, submitit"
ERRORS = [
    (
        (CountingEnv, None, 3),
        {},
        TypeError,
        r"^Collector takes at most 2 positional arguments \(create_env_fn, policy\), got 3; pass the others by "
        r"keyword$",
    ),
    (
        (CountingEnv,),
        {"num_collectors": True},
        TypeError,
        r"^num_collectors must be a positive integer or None, got True$",
    ),
    (
        (CountingEnv,),
        {"num_collectors": 2.0},
        TypeError,
        r"^num_collectors must be a positive integer or None, got 2\.0$",
    ),
    ((CountingEnv,), {"num_collectors": 0}, ValueError, r"^num_collectors must be a positive integer, got 0$"),
    ((CountingEnv,), {"backend": "thread"}, ValueError, rf"^backend must be one of {_CHOICES}, got 'thread'$"),
    ((CountingEnv,), {"backend": 1}, TypeError, r"^backend must be a str or None, got 1$"),
    (
        (CountingEnv,),
        {"backend": "process", "backend_options": [("launcher", "mp")]},
        TypeError,
        r"^backend_options must be a dict or None, got \[\('launcher', 'mp'\)\]$",
    ),
    (
        (CountingEnv,),
        {"backend": "process", "backend_options": {"sync": True}},
        ValueError,
        r"^backend_options may not set the reserved keys \['sync'\]; pass num_collectors= and sync= to Collector "
        r"itself \(num_collectors sets num_workers\)$",
    ),
    (
        (CountingEnv,),
        {"backend": "process", "backend_options": {"num_workers": 2}},
        ValueError,
        r"^backend_options may not set the reserved keys \['num_workers'\]",
    ),
    (
        (CountingEnv,),
        {"backend": "ray", "backend_options": {"remote_configs": {}}, "remote_configs": {}},
        ValueError,
        r"^backend_options duplicate the arguments \['remote_configs'\] also given to Collector; pass each argument "
        r"once$",
    ),
    (
        (CountingEnv, None),
        {"backend": "process", "backend_options": {"policy": None}},
        ValueError,
        r"^backend_options duplicate the arguments \['policy'\]",
    ),
    (
        (CountingEnv,),
        {"backend": "direct", "num_collectors": 2},
        ValueError,
        r"^backend='direct' runs at most one collector, got num_collectors=2; use backend='process' to run several$",
    ),
    (
        ([CountingEnv, CountingEnv],),
        {"backend": "direct"},
        ValueError,
        r"^backend='direct' takes exactly one env factory, got a sequence of 2; use backend='process' \(or "
        r"num_collectors=\) to run one collector per factory$",
    ),
    (
        (CountingEnv,),
        {"backend": "direct", "sync": True},
        ValueError,
        r"^sync is only valid for the non-direct backends, got sync=True for 'direct'; drop it$",
    ),
    (
        (CountingEnv,),
        {"backend_options": {"launcher": "mp"}},
        ValueError,
        r"^backend_options are only valid for the non-direct backends, got \['launcher'\] for 'direct'; pass these "
        r"arguments to Collector itself$",
    ),
    ((CountingEnv,), {"num_collectors": 2, "sync": 1}, TypeError, r"^sync must be a bool or None, got 1$"),
    (
        ([CountingEnv],),
        {"backend": "process", "num_collectors": 2},
        ValueError,
        r"^num_collectors=2 does not match the 1 env factories in create_env_fn; give one factory per collector, or "
        r"one factory and num_collectors$",
    ),
    (
        ([],),
        {"backend": "process"},
        ValueError,
        r"^create_env_fn must list at least one env factory, got an empty sequence$",
    ),
    (
        (CountingEnv,),
        {"backend": "submitit", "backend_options": {"launcher": "mp"}},
        ValueError,
        r"^backend='submitit' requires launcher='submitit', got launcher='mp'; drop launcher or use "
        r"backend='distributed'$",
    ),
]


@pytest.mark.parametrize(("args", "selectors", "error", "message"), ERRORS)
def test_bad_selectors_raise_before_anything_is_built(
    api: types.ModuleType, calls: Calls, args: tuple[Any, ...], selectors: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        api.Collector(*args, frames_per_batch=8, **selectors)
    assert calls.by_class == {name: [] for name in TARGETS}


def test_an_unsupported_service_backend_names_the_enclosing_context(api: types.ModuleType, calls: Calls) -> None:
    torchrl = _torchrl()
    message = (
        r"^Collector has no 'thread' backend, which the enclosing torchrl.service_backend context selects; "
        rf"pass backend= \(one of {_CHOICES}\) or construct it outside that context$"
    )
    with torchrl.service_backend("thread"), pytest.raises(ValueError, match=message):
        api.Collector(CountingEnv, frames_per_batch=8)
    assert calls.by_class == {name: [] for name in TARGETS}


# -- the process backend, for real --------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.anyio
async def test_process_backend_collects_a_batch_async() -> None:
    collector = aiocollect.Collector(CountingEnv, num_collectors=2, sync=True, frames_per_batch=8, total_frames=8)
    assert isinstance(collector, aiocollect.MultiSyncCollector)
    with anyio.fail_after(90):
        async with collector:
            batches = [batch async for batch in collector]
    assert [b.numel() for b in batches] == [8]
    # One batch per worker, stacked in worker order.
    assert batches[0].shape[0] == 2


@pytest.mark.timeout(120)
def test_process_backend_collects_a_batch_blocking() -> None:
    with aiocollect.SyncDataCollector(CountingEnv, num_collectors=2, frames_per_batch=8, total_frames=16) as c:
        assert isinstance(c, aiocollect.blocking.MultiAsyncCollector)
        assert not isinstance(c, aiocollect.SyncDataCollector)
        frames = [batch.numel() for batch in c]
    assert frames == [8, 8]  # whichever worker's batch is ready first, until the budget is spent
