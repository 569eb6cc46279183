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
import json
import re
import subprocess
import sys
import types
from pathlib import Path
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


NODE_COLLECTORS = ["DistributedCollector", "DistributedSyncCollector", "RPCCollector", "RayCollector"]
TWINS = ["Collector", "MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector", *NODE_COLLECTORS, "ReplayBuffer"]
#: The arguments only ``Collector(...)`` itself takes, to choose the class it builds (TorchRL's
#: front door); the classes it builds have their own ``backend``/``sync`` or none.
FRONT_DOOR_SELECTORS = ("backend", "backend_options", "num_collectors", "sync")
#: Arguments of the in-process ``Collector`` alone: a multi-worker collector numbers its workers itself.
DIRECT_ONLY = ("worker_idx",)


def _shared_collector_parameters() -> dict[str, inspect.Parameter]:
    """`Collector`'s arguments that every collector shares (its signature, less the selectors)."""
    import aiocollect

    params = inspect.signature(aiocollect.Collector).parameters
    return {name: p for name, p in params.items() if name not in (*FRONT_DOOR_SELECTORS, *DIRECT_ONLY)}


@pytest.mark.parametrize("module", ["aiocollect", "aiocollect.blocking"])
def test_collector_signature_shows_the_front_door_selectors(module: str) -> None:
    # TorchRL 0.14's public signature: Collector(create_env_fn, policy=None, *, backend=None,
    # backend_options=None, num_collectors=None, sync=None, ...), without self.
    collector = importlib.import_module(module).Collector
    params = inspect.signature(collector).parameters
    assert list(params)[:2] == ["create_env_fn", "policy"]
    for name in FRONT_DOOR_SELECTORS:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default is None, name
    assert params["frames_per_batch"].default is inspect.Parameter.empty
    # Only the front door takes them: the class's own __init__ does not.
    init = inspect.signature(collector.__init__ if module == "aiocollect" else collector._async_class.__init__)
    assert not set(FRONT_DOOR_SELECTORS) & set(init.parameters)


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

    shared = _shared_collector_parameters()
    params = inspect.signature(getattr(aiocollect, name)).parameters
    assert not {"backend_options", "num_collectors", *DIRECT_ONLY} & set(params)
    for arg, p in shared.items():
        assert arg in params and params[arg].default == p.default, arg
    with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'frame_per_batch'$"):
        getattr(aiocollect, name)("CartPole-v1", frame_per_batch=8)
    with pytest.raises(TypeError, match=rf"^{name}\(\) missing required keyword-only argument: 'frames_per_batch'$"):
        getattr(aiocollect, name)(
            "CartPole-v1", num_workers=1
        ) if name != "AsyncCollector" else aiocollect.AsyncCollector("CartPole-v1")


@pytest.mark.parametrize("name", NODE_COLLECTORS)
def test_node_collectors_have_full_signatures(name: str) -> None:
    # Every argument named, annotated and with its default, as the multi-process collectors.
    import aiocollect

    cls = getattr(aiocollect, name)
    params = inspect.signature(cls).parameters
    assert not [p for p in params.values() if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    assert not [n for n, p in params.items() if p.annotation is inspect.Parameter.empty]
    assert params["frames_per_batch"].default is inspect.Parameter.empty
    for arg, p in _shared_collector_parameters().items():
        if arg in params:  # an argument shared with Collector has Collector's default
            assert params[arg].default == p.default, arg
    assert ("sync" in params) is (name != "DistributedSyncCollector")
    assert params["update_interval"].default == (1 if name == "DistributedSyncCollector" else None)
    # Python's own message (3.13 adds a suggestion to it).
    suggestion = r"(\. Did you mean 'frames_per_batch'\?)?"
    msg = rf"^{name}\.__init__\(\) got an unexpected keyword argument 'frame_per_bat'{suggestion}$"
    with pytest.raises(TypeError, match=msg):
        cls(["CartPole-v1"], frame_per_bat=8)
    with pytest.raises(TypeError, match=rf"^{name}\.__init__\(\) missing 1 required keyword-only argument"):
        cls(["CartPole-v1"])


# -- docstrings of the blocking twins ------------------------------------------------------------
_SECTION = re.compile(r"^(Args|Raises|Returns|Yields|Examples?|Notes?|Attributes):$")


def _section(doc: str, title: str) -> list[str]:
    """The lines of a Google-style section of ``doc`` (an empty list if it has none)."""
    lines, out, inside = inspect.cleandoc(doc).splitlines(), [], False
    for line in lines:
        if _SECTION.match(line):
            inside = line == f"{title}:"
        elif inside:
            out.append(line)
    return out


def _arg_entries(doc: str) -> dict[str, str]:
    """The entries of ``doc``'s Args section, by name, in order: each its lines, joined."""
    entries: dict[str, list[str]] = {}
    for line in _section(doc, "Args"):
        match = re.match(r"^    (\*{0,2}\w+)(?: \(.*\))?:", line)
        if match:
            entries[match.group(1)] = [line]
        elif line.strip() and entries:
            entries[list(entries)[-1]].append(line)
    return {name: "\n".join(lines) for name, lines in entries.items()}


def _documented_args(doc: str) -> list[str]:
    return list(_arg_entries(doc))


def _init_params(cls: type) -> list[str]:
    return list(inspect.signature(cls).parameters)


#: Async classes whose own docstring documents every argument (the multi-process ones
#: refer to `Collector` for the shared ones, through a ``**others`` entry).
FULLY_DOCUMENTED = ["Collector", *NODE_COLLECTORS, "ReplayBuffer"]


@pytest.mark.parametrize("name", FULLY_DOCUMENTED)
def test_async_docstring_documents_every_argument(name: str) -> None:
    import aiocollect

    cls = getattr(aiocollect, name)
    assert sorted(_documented_args(cls.__doc__)) == sorted(_init_params(cls))


@pytest.mark.parametrize("name", TWINS)
def test_twin_docstring_is_the_async_docstring_with_every_argument(name: str) -> None:
    # help(aiocollect.MultiSyncDataCollector) describes the collector and each of its arguments.
    import aiocollect
    import aiocollect.blocking

    async_cls, twin = getattr(aiocollect, name), getattr(aiocollect.blocking, name)
    doc = inspect.cleandoc(twin.__doc__)
    assert doc.startswith(f"Blocking twin of `aiocollect.{name}`")
    assert "{args}" not in doc
    # The async class's description, under the twin's public name.
    assert inspect.cleandoc(async_cls.__doc__).splitlines()[0] in doc
    # Every parameter of the signature, once, in signature order; nothing else.
    assert _documented_args(doc) == _init_params(twin)
    for arg, entry in _arg_entries(async_cls.__doc__).items():
        assert arg == "**others" or entry in doc, entry  # the async class's own words
    # The example is the blocking usage.
    example = "\n".join(_section(doc, "Examples"))
    assert "from aiocollect.blocking import" in example
    assert "async " not in example and "await " not in example and "anyio.run" not in example
    assert f"`aiocollect.{name}`" in twin.__init__.__doc__


def test_twin_docstrings_show_in_help() -> None:
    import pydoc

    import aiocollect

    text = pydoc.render_doc(aiocollect.MultiSyncDataCollector, renderer=pydoc.plaintext)
    for arg in ("num_workers", "cat_results", "frames_per_batch", "split_trajs", "replay_buffer"):
        assert re.search(rf"^[ |]*{arg}: [A-Z`]", text, re.MULTILINE), arg  # described, not only in the signature


def test_a_users_own_twin_keeps_its_docstring() -> None:
    # DataCollectorBase is public: a subclass naming its own async class is left as written.
    import aiocollect

    class MyCollector(aiocollect.DataCollectorBase):
        """My blocking collector."""

        _async_class = aiocollect.Collector

    assert MyCollector.__doc__ == "My blocking collector."
    assert inspect.signature(MyCollector) == inspect.signature(aiocollect.Collector)


_PRIVATE_PATHS_SCRIPT = """
import importlib, inspect, json
import aiocollect.blocking
found = []
for modulename in ("aiocollect.blocking", "aiocollect", "aiocollect.testing"):  # blocking first, as a user might
    module = importlib.import_module(modulename)
    docs = [(modulename, module.__doc__)]
    for name in module.__all__:
        obj = getattr(module, name)
        docs.append((f"{modulename}.{name}", getattr(obj, "__doc__", None)))
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if not attr.startswith("_") or attr == "__init__":
                    value = getattr(value, "fget", value)
                    docs.append((f"{modulename}.{name}.{attr}", getattr(value, "__doc__", None)))
    found += [where for where, doc in docs if isinstance(doc, str) and "aiocollect._" in doc]
import pydoc
for name in aiocollect.blocking.__all__:  # help() of each twin, base classes included
    if "aiocollect._" in pydoc.render_doc(getattr(aiocollect.blocking, name), renderer=pydoc.plaintext):
        found.append(f"help(aiocollect.blocking.{name})")
print(json.dumps(sorted(set(found))))
"""


def test_public_docstrings_name_no_private_path() -> None:
    # Run in a fresh interpreter: which paths an object shows depends on what was imported first.
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", _PRIVATE_PATHS_SCRIPT], capture_output=True, text=True, cwd=root,
                          timeout=120, check=True)  # fmt: skip
    assert json.loads(proc.stdout) == [], "docstrings that name a private module (aiocollect._...)"


def test_public_classes_methods_name_the_public_module() -> None:
    # Python 3.13's help() names each inherited method's own module ("from <module>.<class>"):
    # renaming only the class's __module__ left the private path there.
    import aiocollect
    import aiocollect.blocking

    base = aiocollect.DataCollectorBase
    assert base.__module__ == "aiocollect"
    assert base.__next__.__module__ == "aiocollect"
    assert inspect.getattr_static(base, "stats").__module__ == "aiocollect"
    buffer = aiocollect.ReplayBuffer
    assert buffer.__module__ == "aiocollect"
    assert buffer.sample.__module__ == "aiocollect"
    assert type(inspect.getattr_static(buffer, "closed")).__name__ == "property"
    assert inspect.getattr_static(buffer, "closed").fget.__module__ == "aiocollect"
    assert aiocollect.MultiSyncDataCollector.__next__.__module__ == "aiocollect"  # inherited by every twin


_FIRST_LOOKUP_SCRIPT = """
import pydoc, re, sys
first = sys.argv[1]
if first == "blocking":
    import aiocollect.blocking as module
    first = "Collector"
else:
    import aiocollect as module
obj = getattr(module, first)
import aiocollect
from aiocollect._core._names import LAZY
public = set(aiocollect.__all__)
shown = re.findall(r"aiocollect\\.(?:\\w+\\.)*_\\w+\\.(\\w+)", pydoc.render_doc(obj, renderer=pydoc.plaintext))
bad = sorted({name for name in shown if name in public})
for name, (module_name, attr) in LAZY.items():  # every public class loaded so far, looked up or not
    loaded = sys.modules.get("aiocollect" + module_name)
    value = getattr(loaded, attr, None)
    if isinstance(value, type) and value.__module__.startswith("aiocollect._"):
        bad.append(f"{name}: {value.__module__}")
print(bad)
"""


@pytest.mark.parametrize("first", ["AsyncBatchedCollector", "AsyncCollector", "PrioritizedSampler", "blocking"])
def test_public_bases_are_public_whichever_name_is_looked_up_first(first: str) -> None:
    # help(AsyncBatchedCollector) in a fresh process showed its base as
    # aiocollect._collect._collector.Collector, and a WorkerError raised before anyone looked
    # up aiocollect.WorkerError printed its private path: names were published at their own
    # first lookup only. Private mixins (CollectorLifecycle, ...) keep their true path.
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", _FIRST_LOOKUP_SCRIPT, first], capture_output=True, text=True,
                          cwd=root, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_public_submodules_are_attributes_after_a_bare_import() -> None:
    # In a fresh interpreter: any other test may have imported the submodules already.
    code = (
        "import aiocollect\n"
        "rb = aiocollect.blocking.ReplayBuffer(8)\n"
        "rb.close()\n"
        "print(aiocollect.blocking.Collector.__name__, aiocollect.testing.CountingEnv.__name__)\n"
        "assert {'blocking', 'testing'} <= set(dir(aiocollect))\n"
    )
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, cwd=root,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["Collector", "CountingEnv"]


@pytest.mark.parametrize("name", ["Collector", "MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector"])
def test_collectors_take_torchrls_weight_sync_api(name: str) -> None:
    # TorchRL's forms of update_policy_weights_, weight_sync_schemes/weight_updater and the
    # policy-version accessors, on the async class and its blocking twin alike.
    import aiocollect

    for cls in (getattr(aiocollect, name), getattr(aiocollect.blocking, name)):
        update = inspect.signature(cls.update_policy_weights_).parameters
        assert {"weights", "policy", "worker_ids", "model_id", "weights_dict"} <= set(update), cls
        assert {"weight_sync_schemes", "weight_updater"} <= set(inspect.signature(cls).parameters), cls
        assert isinstance(inspect.getattr_static(cls, "policy_version"), property), cls
        assert inspect.getdoc(cls.get_policy_version), cls


@pytest.mark.parametrize("name", NODE_COLLECTORS)
def test_node_collectors_report_their_policy_version(name: str) -> None:
    import aiocollect

    for cls in (getattr(aiocollect, name), getattr(aiocollect.blocking, name)):
        assert isinstance(inspect.getattr_static(cls, "policy_version"), property), cls
        assert callable(cls.get_policy_version), cls
