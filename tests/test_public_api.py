"""The public API is exactly what the public modules' ``__all__`` lists, and is documented.

In the spirit of anyio's ``test_all_attributes``: for each public module,

* every name in ``__all__`` exists and ``__all__`` has no duplicates;
* every public (no leading underscore) class or function defined inside the aiocollect
  package that the module exposes is listed in ``__all__`` (a plain import of another
  public module's API, such as ``BatchedEnv`` used by ``aiocollect.testing``, is exempt);
* every exported class or function claims the public module as its ``__module__`` (so
  reprs, pickles and the API docs name ``aiocollect.Collector``, not a private module),
  and ``<__module__>.<__qualname__>`` leads back to the same object;
* every exported class or function has a docstring of its own.

An object exported from several public modules (``aiocollect.SyncDataCollector`` is
``aiocollect.blocking.Collector``) belongs to the one named by its ``__module__``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import types
from typing import Any

import pytest

PUBLIC_MODULES = ["aiocollect", "aiocollect.blocking", "aiocollect.testing"]
PACKAGE = "aiocollect"

# Names the package's top-level API is documented to provide.
EXPECTED_TOP_LEVEL = {
    "Collector",
    "SyncDataCollector",
    "DataCollectorBase",
    "split_trajectories",
    "BatchedEnv",
    "AsyncBatchedEnv",
    "AsyncEnvPool",
    "EnvSpec",
    "ArraySpec",
    "wrap_gymnasium",
    "CollectorStats",
    "AiocollectError",
    "CollectorClosedError",
    "WouldBlock",
    "PolicyOutputError",
    "WorkerError",
    "WorkerCrashedError",
}


def _in_package(obj: object) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _is_api_object(obj: object) -> bool:
    return inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)


def _exported(modulename: str) -> dict[str, Any]:
    module = importlib.import_module(modulename)
    return {name: getattr(module, name) for name in module.__all__ if hasattr(module, name)}


def _exporting_modules(obj: object) -> set[str]:
    """The public modules whose ``__all__`` lists ``obj`` itself."""
    found = set()
    for modulename in PUBLIC_MODULES:
        if any(value is obj for value in _exported(modulename).values()):
            found.add(modulename)
    return found


def _own_doc(obj: object) -> str:
    # ``obj.__doc__``, not inspect.getdoc(): getdoc() inherits a base class's docstring,
    # so an undocumented exception subclass would pass with Exception's docstring.
    doc = (getattr(obj, "__doc__", None) or "").strip()
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        # @dataclass fills an absent docstring with the signature: "Name(a: int, ...)"
        if doc.startswith(f"{obj.__name__}("):
            return ""
    return doc


@pytest.fixture(params=PUBLIC_MODULES)
def module(request: pytest.FixtureRequest) -> types.ModuleType:
    return importlib.import_module(request.param)


def test_all_is_a_sequence_of_strings(module: types.ModuleType) -> None:
    assert hasattr(module, "__all__"), f"{module.__name__} has no __all__"
    assert isinstance(module.__all__, (list, tuple))
    assert all(isinstance(name, str) for name in module.__all__)


def test_all_has_no_duplicates(module: types.ModuleType) -> None:
    seen: set[str] = set()
    duplicates = sorted({name for name in module.__all__ if name in seen or seen.add(name)})
    assert not duplicates, f"{module.__name__}.__all__ lists these twice: {duplicates}"


def test_every_name_in_all_is_defined(module: types.ModuleType) -> None:
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{module.__name__}.__all__ names undefined attributes: {missing}"


def _owned_by_other_public_module(obj: object, modulename: str) -> bool:
    """``obj`` is another public module's API (its ``__module__`` exports it)."""
    owner = getattr(obj, "__module__", None)
    return owner != modulename and owner in PUBLIC_MODULES and owner in _exporting_modules(obj)


def test_public_package_objects_are_in_all(module: types.ModuleType) -> None:
    # A public name that is merely another public module's API imported for use here
    # (e.g. ``BatchedEnv`` in aiocollect.testing) need not be re-exported; anything else
    # from the package (a private module's class or function) must be listed.
    exported = set(module.__all__)
    unlisted = sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and _is_api_object(value)
        and _in_package(value)
        and name not in exported
        and not _owned_by_other_public_module(value, module.__name__)
    )
    assert not unlisted, (
        f"{module.__name__} exposes public aiocollect classes/functions missing from "
        f"__all__ (export them or import them under a private name): {unlisted}"
    )


def test_exports_claim_the_public_module(module: types.ModuleType) -> None:
    wrong = []
    for name, obj in _exported(module.__name__).items():
        if not _is_api_object(obj) or not _in_package(obj):
            continue
        owner = obj.__module__
        # Either this module owns it, or it re-exports an object that another public
        # module owns and exports (e.g. aiocollect.SyncDataCollector).
        if owner != module.__name__ and not (owner in PUBLIC_MODULES and owner in _exporting_modules(obj)):
            wrong.append(f"{name}: __module__ is {owner!r}, expected {module.__name__!r}")
            continue
        target: Any = importlib.import_module(owner)
        for part in getattr(obj, "__qualname__", name).split("."):
            target = getattr(target, part, None)
        if target is not obj:
            wrong.append(f"{name}: {owner}.{obj.__qualname__} is not this object")
    assert not wrong, f"{module.__name__}: " + "; ".join(wrong)


def test_exports_have_docstrings(module: types.ModuleType) -> None:
    undocumented = sorted(
        name
        for name, obj in _exported(module.__name__).items()
        if _is_api_object(obj) and _in_package(obj) and not _own_doc(obj)
    )
    assert not undocumented, f"{module.__name__}: no docstring on {undocumented}"


def test_public_modules_have_docstrings(module: types.ModuleType) -> None:
    assert (module.__doc__ or "").strip(), f"{module.__name__} has no module docstring"


def test_top_level_api_is_complete() -> None:
    import aiocollect

    missing = sorted(EXPECTED_TOP_LEVEL - set(aiocollect.__all__))
    assert not missing, f"aiocollect.__all__ lacks {missing}"


def test_sync_data_collector_is_the_blocking_collector() -> None:
    import aiocollect
    import aiocollect.blocking

    assert aiocollect.SyncDataCollector is aiocollect.blocking.Collector
    assert "Collector" in aiocollect.blocking.__all__


def test_installed_version_matches_source() -> None:
    from aiocollect._version import __version__

    try:
        installed = importlib.metadata.version("aiocollect")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("aiocollect is not installed (running from a bare checkout)")
    assert installed == __version__


TWINS = ["Collector", "MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector", "ReplayBuffer"]


@pytest.mark.parametrize("name", TWINS)
def test_blocking_twins_show_the_async_signature(name: str) -> None:
    import aiocollect
    import aiocollect.blocking

    async_cls, twin = getattr(aiocollect, name), getattr(aiocollect.blocking, name)
    sig = inspect.signature(twin)
    assert sig == inspect.signature(async_cls)
    kinds = {p.kind for p in sig.parameters.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds and inspect.Parameter.VAR_POSITIONAL not in kinds
    assert "create_env_fn" in sig.parameters or "capacity" in sig.parameters


def test_async_collector_signature_is_multiasync_less_num_workers() -> None:
    import aiocollect

    multi = inspect.signature(aiocollect.MultiAsyncCollector).parameters
    single = inspect.signature(aiocollect.AsyncCollector).parameters
    assert list(single) == [n for n in multi if n != "num_workers"]


@pytest.mark.parametrize("name", ["MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector"])
def test_multi_collectors_take_every_collector_argument(name: str) -> None:
    # Collector's signature is the one declaration of the shared arguments and defaults.
    import aiocollect

    shared = inspect.signature(aiocollect.Collector).parameters
    params = inspect.signature(getattr(aiocollect, name)).parameters
    for arg, p in shared.items():
        assert arg in params and params[arg].default == p.default, arg
    with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'frame_per_batch'$"):
        getattr(aiocollect, name)("CartPole-v1", frame_per_batch=8)
    with pytest.raises(TypeError, match=rf"^{name}\(\) missing required keyword-only argument: 'frames_per_batch'$"):
        getattr(aiocollect, name)(
            "CartPole-v1", num_workers=1
        ) if name != "AsyncCollector" else aiocollect.AsyncCollector("CartPole-v1")
