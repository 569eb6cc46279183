"""The front door: ``Collector(...)`` picks the collector class from four selector arguments.

TorchRL 0.14's ``Collector`` is the one entry point to every collector: ``backend``,
``num_collectors``, ``sync`` and ``backend_options`` choose between the single-process
collector, the multi-process ones and the distributed ones. `FrontDoor`, the metaclass of
`aiocollect.Collector` and of its blocking twin, gives aiocollect the same entry point:

* ``aiocollect.Collector(...)`` builds one of aiocollect's async classes, and
  ``aiocollect.blocking.Collector(...)`` (``aiocollect.SyncDataCollector``) its blocking twin;
  the object returned keeps its own type (a `MultiSyncCollector` is not a `Collector`).
* Only the class that declares the front door dispatches: a subclass is built as written and
  takes the selectors only if its own ``__init__`` does.
* The chosen class is named in a public module (``targets=``), looked up by name when first
  needed: the front door sits below the multi-process and distributed layers it leads to.
* Every argument is checked before the chosen class is built, and building one spawns nothing.
"""

from __future__ import annotations

import abc
import contextvars
import importlib
import inspect
import sys
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from .._core._public import publish

__all__ = ["SELECTORS", "FrontDoor"]

#: The arguments only the front door takes; they select the class and are not passed on.
SELECTORS = ("backend", "backend_options", "num_collectors", "sync")

_BACKENDS = ("direct", "process", "ray", "rpc", "distributed", "submitit")
_ALIASES = {"multiprocessing": "process"}  # TorchRL's long spelling, kept as a permanent alias
_CHOICES = ", ".join(sorted((*_BACKENDS, *_ALIASES)))
# backend_options merge into the chosen class's arguments: selectors there would be ambiguous,
# and num_workers is what num_collectors sets. ("backend" is not reserved: it is the chosen
# class's own argument, e.g. DistributedCollector(backend="gloo").)
_RESERVED = frozenset({"backend_options", "num_collectors", "num_workers", "sync"})
_NODE_CLASSES = {"ray": "RayCollector", "rpc": "RPCCollector", "distributed": "DistributedCollector"}
_POSITIONAL = ("create_env_fn", "policy")

# Set while a direct collector (or a subclass) is built. The blocking twin's ``__init__``
# builds its async `Collector` then: that inner call must build the direct collector too,
# whatever an enclosing torchrl.service_backend context says, and never dispatch.
_BUILDING_DIRECT: contextvars.ContextVar[bool] = contextvars.ContextVar("aiocollect_building_direct", default=False)

_KW = inspect.Parameter.KEYWORD_ONLY
_SELECTOR_PARAMETERS = (
    inspect.Parameter("backend", _KW, default=None, annotation="str | None"),
    inspect.Parameter("backend_options", _KW, default=None, annotation="dict[str, Any] | None"),
    inspect.Parameter("num_collectors", _KW, default=None, annotation="int | None"),
    inspect.Parameter("sync", _KW, default=None, annotation="bool | None"),
)


def _context_backend() -> str | None:
    """The backend of an enclosing ``torchrl.service_backend(...)`` block, or None.

    TorchRL keeps it in a context variable that only its private ``_get_service_backend``
    reads (it also ignores a value inherited by a forked child). A process that never
    imported torchrl cannot be inside such a block, so torchrl is never imported here.
    """
    getter = getattr(sys.modules.get("torchrl._comm.backends"), "_get_service_backend", None)
    return getter() if callable(getter) else None


def _choose_backend(backend: Any, num_collectors: int | None) -> str:
    if backend is not None:
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a str or None, got {backend!r}")
        chosen = _ALIASES.get(backend, backend)
        if chosen not in _BACKENDS:
            raise ValueError(f"backend must be one of {_CHOICES}, got {backend!r}")
        return chosen
    context = _context_backend()
    if context is not None:
        chosen = _ALIASES.get(context, context)
        if chosen not in _BACKENDS:
            raise ValueError(
                f"Collector has no {context!r} backend, which the enclosing torchrl.service_backend context "
                f"selects; pass backend= (one of {_CHOICES}) or construct it outside that context"
            )
        return chosen
    return "process" if num_collectors is not None else "direct"


def _options(backend_options: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``backend_options`` (the caller's dict is never changed), checked."""
    if backend_options is None:
        return {}
    if not isinstance(backend_options, Mapping):
        raise TypeError(f"backend_options must be a dict or None, got {backend_options!r}")
    options = dict(backend_options)
    reserved = sorted(_RESERVED & options.keys())
    if reserved:
        raise ValueError(
            f"backend_options may not set the reserved keys {reserved}; pass num_collectors= and sync= to "
            "Collector itself (num_collectors sets num_workers)"
        )
    duplicates = sorted(options.keys() & {*kwargs, *_POSITIONAL[: len(args)]})
    if duplicates:
        raise ValueError(
            f"backend_options duplicate the arguments {duplicates} also given to Collector; pass each argument once"
        )
    return options


def _env_fns(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else kwargs.get("create_env_fn")


def _with_env_fns(args: tuple[Any, ...], kwargs: dict[str, Any], env: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args:
        return (env, *args[1:]), kwargs
    return args, {**kwargs, "create_env_fn": env}


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _direct(
    args: tuple[Any, ...], kwargs: dict[str, Any], num_collectors: Any, sync: Any, options: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if num_collectors not in (None, 1):
        raise ValueError(
            f"backend='direct' runs at most one collector, got num_collectors={num_collectors!r}; "
            "use backend='process' to run several"
        )
    if sync is not None:
        raise ValueError(f"sync is only valid for the non-direct backends, got sync={sync!r} for 'direct'; drop it")
    if options:
        raise ValueError(
            f"backend_options are only valid for the non-direct backends, got {sorted(options)} for 'direct'; "
            "pass these arguments to Collector itself"
        )
    env = _env_fns(args, kwargs)
    if not _is_sequence(env):
        return args, kwargs
    if len(env) != 1:
        raise ValueError(
            f"backend='direct' takes exactly one env factory, got a sequence of {len(env)}; use backend='process' "
            "(or num_collectors=) to run one collector per factory"
        )
    return _with_env_fns(args, kwargs, env[0])


def _replicate(
    args: tuple[Any, ...], kwargs: dict[str, Any], num_collectors: int | None
) -> tuple[tuple[Any, ...], dict[str, Any], int | None]:
    """``create_env_fn`` as a list with one factory per collector, and the number of collectors."""
    if not args and "create_env_fn" not in kwargs:
        return args, kwargs, num_collectors  # the chosen class reports the missing argument
    env = _env_fns(args, kwargs)
    if _is_sequence(env):
        env = list(env)
        if not env:
            raise ValueError("create_env_fn must list at least one env factory, got an empty sequence")
        if num_collectors is not None and num_collectors != len(env):
            raise ValueError(
                f"num_collectors={num_collectors} does not match the {len(env)} env factories in create_env_fn; "
                "give one factory per collector, or one factory and num_collectors"
            )
    else:
        env = [env] * (num_collectors or 1)
    return (*_with_env_fns(args, kwargs, env), len(env))


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, Enum))


def _drop_generic_defaults(front: inspect.Signature, target: type, kwargs: dict[str, Any]) -> None:
    """Drop the arguments that only repeat `Collector`'s default where ``target`` differs.

    A config that spells out every `Collector` argument with its default (TorchRL's
    structured configs do) then gets the chosen class's own defaults, and no error for an
    argument that class does not have. A value other than the default is always passed on.
    """
    target_parameters = inspect.signature(target).parameters
    empty = inspect.Parameter.empty
    for name in [n for n in kwargs if n in front.parameters and n not in SELECTORS]:
        default, value = front.parameters[name].default, kwargs[name]
        if default is empty or not _plain(default):
            continue
        if not (value is default or (type(value) is type(default) and value == default)):
            continue
        own = target_parameters.get(name)
        # A required argument of the target keeps the value given; it has no default to fall back on.
        if own is None or (own.default is not empty and own.default is not default and own.default != default):
            del kwargs[name]


class FrontDoor(abc.ABCMeta):
    """Metaclass of `Collector` and its blocking twin: calling the class itself dispatches.

    ``class Collector(..., metaclass=FrontDoor, targets="aiocollect")`` makes
    ``Collector(...)`` take the selectors `SELECTORS` and build the class they choose, named
    in the public module ``targets``. Subclasses (which pass no ``targets``) do not dispatch.
    ``inspect.signature`` of a front-door class lists the selectors after its positional
    arguments. Derived from ``ABCMeta`` so a subclass may also derive from an ABC.
    """

    _front_door_targets: str | None

    def __new__(
        mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], /, targets: str | None = None, **kw: Any
    ) -> FrontDoor:
        cls = super().__new__(mcs, name, bases, namespace, **kw)
        cls._front_door_targets = targets  # set on every class, so subclasses get None
        return cls

    def __init__(
        cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], /, targets: str | None = None, **kw: Any
    ) -> None:
        super().__init__(name, bases, namespace, **kw)

    @property
    def __signature__(cls) -> inspect.Signature:
        # inspect.signature() reads this before anything else: without it, it would show this
        # metaclass's __call__ (*args, **kwargs).
        init = cls.__init__  # type: ignore[misc]  # the class's own (or inherited) __init__, as inspect reads it
        sig = inspect.signature(init)
        params = list(sig.parameters.values())[1:]  # without self
        if cls._front_door_targets is not None:
            if "backend" not in sig.parameters:
                positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
                params = [*positional, *_SELECTOR_PARAMETERS, *params[len(positional) :]]
        else:
            front = next((base for base in cls.__mro__ if base.__dict__.get("_front_door_targets")), None)
            if front is not None and front.__dict__.get("__init__") is init:
                # A subclass inheriting the blocking twin's __init__ (which lists the async
                # class's selectors) does not take them: it is built as the direct collector.
                params = [p for p in params if p.name not in SELECTORS]
        return sig.replace(parameters=params)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        targets = cls._front_door_targets
        if targets is None or _BUILDING_DIRECT.get():
            # A subclass, or the async collector a blocking one is being built around: a plain
            # class, whose __init__ rejects the selectors as unexpected keyword arguments.
            return _build_direct(super().__call__, args, kwargs)
        selectors = {name: kwargs.pop(name, None) for name in SELECTORS}
        target, args, kwargs = _plan(args, kwargs, **selectors)
        if target is None:
            return _build_direct(super().__call__, args, kwargs)
        target_cls = getattr(importlib.import_module(targets), target)
        _drop_generic_defaults(inspect.signature(cls), target_cls, kwargs)
        return target_cls(*args, **kwargs)


def _build_direct(build: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    token = _BUILDING_DIRECT.set(True)
    try:
        return build(*args, **kwargs)
    finally:
        _BUILDING_DIRECT.reset(token)


def _plan(
    args: tuple[Any, ...], kwargs: dict[str, Any], *, backend: Any, backend_options: Any, num_collectors: Any, sync: Any
) -> tuple[str | None, tuple[Any, ...], dict[str, Any]]:
    """The class to build (``None``: the direct collector) and its arguments; every check is here."""
    if len(args) > len(_POSITIONAL):
        raise TypeError(
            f"Collector takes at most {len(_POSITIONAL)} positional arguments (create_env_fn, policy), got "
            f"{len(args)}; pass the others by keyword"
        )
    if num_collectors is not None:
        if isinstance(num_collectors, bool) or not isinstance(num_collectors, int):
            raise TypeError(f"num_collectors must be a positive integer or None, got {num_collectors!r}")
        if num_collectors < 1:
            raise ValueError(f"num_collectors must be a positive integer, got {num_collectors!r}")
    chosen = _choose_backend(backend, num_collectors)
    options = _options(backend_options, args, kwargs)
    if chosen == "direct":
        return (None, *_direct(args, kwargs, num_collectors, sync, options))
    if sync is None:
        sync = False  # TorchRL's default: workers collect ahead, each batch is the first to arrive
    elif not isinstance(sync, bool):
        raise TypeError(f"sync must be a bool or None, got {sync!r}")
    args, kwargs, n = _replicate(args, {**kwargs, **options}, num_collectors)
    if chosen == "process":
        return ("MultiSyncCollector" if sync else "MultiAsyncCollector"), args, kwargs
    if chosen == "submitit":
        launcher = kwargs.setdefault("launcher", "submitit")
        if launcher != "submitit":
            raise ValueError(
                f"backend='submitit' requires launcher='submitit', got launcher={launcher!r}; drop launcher or use "
                "backend='distributed'"
            )
        chosen = "distributed"
    if chosen == "ray" and n is not None:
        kwargs["num_collectors"] = n
    return _NODE_CLASSES[chosen], args, {**kwargs, "sync": sync}


# help() of a front-door class names its metaclass ("class methods ... from <metaclass>"). It
# is no public API, but a private module path there would only confuse: name the package.
publish(FrontDoor)
