"""TorchRL's weight-sync surface: ``weight_sync_schemes``, ``weight_updater``, ``update_policy_weights_``'s forms.

aiocollect honours TorchRL's scheme objects without driving them. A scheme sets up queues,
background threads and shared buffers against TorchRL's own worker loop (it reads the
collector's ``pipes``, devices and models), which aiocollect's workers do not run; and a
worker must acknowledge every update, which only aiocollect's own commands carry. So each
known scheme is mapped onto aiocollect's transport, keeping what it promises:

* ``SharedMemWeightSyncScheme`` and ``MultiProcessWeightSyncScheme``: the weights reach every
  worker, parameters and buffers, and each worker acknowledges (with ``sync=False``,
  `update_policy_weights_` does not wait for that). The parent writes them once into a
  shared block; each worker copies them into its own policy between batches, so it holds a
  copy (as ``MultiProcessWeightSyncScheme``'s workers do) and never sees them change in the
  middle of a batch. Weights for one worker alone, a ``worker_ids`` subset, and collectors
  whose policy exists only in the workers (``policy_factory`` without ``policy``) send a
  packed copy through each worker's command channel instead.
* The node collectors' own schemes (``RayWeightSyncScheme`` for `RayCollector`,
  ``RPCWeightSyncScheme`` for `RPCCollector`, ``DistributedWeightSyncScheme`` for the
  torch.distributed ones): the weights reach every node over the node transport, and each
  node acknowledges (``DistributedWeightSyncScheme(sync=False)``: not waited for).
* ``NoWeightSyncScheme``: updates of that model do nothing.
* Any other scheme (another collector kind's, or one of the user's) moves weights over a
  channel this collector does not have: ``NotImplementedError`` at construction.

``weight_recv_schemes`` (a TorchRL collector receiving weights from a parent process) is
refused unless ``None``: aiocollect's collectors take weights only from their own
``update_policy_weights_``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._rollout._policy import NO_ROUTE

__all__ = [
    "DEFAULT_SYNC",
    "LOCAL_SCHEMES",
    "NO_ROUTE",
    "WeightSync",
    "WeightSyncAPI",
    "WeightUpdate",
    "WeightUpdates",
    "check_recv_schemes",
    "parse_update",
    "resolve_weight_sync",
]

_SCHEMES = "torchrl.weight_update.weight_sync_schemes"
_UPDATERS = "torchrl.collectors.weight_update"


@dataclass(frozen=True)
class WeightSync:
    """The validated ``weight_sync_schemes`` / ``weight_updater`` of one collector."""

    enabled: bool  # False: a NoWeightSyncScheme, updates do nothing
    wait: bool  # wait for every worker's acknowledgement (a scheme's ``sync``)
    schemes: dict[str, Any] | None  # as given
    updater: Any = None  # a TorchRL WeightUpdaterBase (the in-process Collector only)


#: No scheme given: aiocollect's own sync, acknowledged.
DEFAULT_SYNC = WeightSync(True, True, None)


@dataclass(frozen=True)
class WeightUpdate:
    """One call of ``update_policy_weights_``, its forms resolved."""

    source: Any  # a module, TensorDict or state dict; None: the collector's own policy
    per_worker: dict[int, Any] | None  # {worker: weights}: each its own
    workers: tuple[int, ...] | None  # the workers to update; None: every worker
    worker_ids: Any  # as given (a weight_updater takes them as they are)


def _torchrl_class(module: str, name: str) -> Any:
    # A TorchRL object exists only once its module was imported: no import needed to check.
    mod = sys.modules.get(module)
    return getattr(mod, name, None)


#: The TorchRL schemes a collector whose workers run on this machine honours.
LOCAL_SCHEMES = ("SharedMemWeightSyncScheme", "MultiProcessWeightSyncScheme")


def resolve_weight_sync(
    owner: str, schemes: Any, updater: Any, *, workers: bool, honoured: tuple[str, ...] = LOCAL_SCHEMES
) -> WeightSync:
    """Check ``weight_sync_schemes`` and ``weight_updater`` (before anything starts).

    ``workers``: the collector runs worker processes (a ``weight_updater`` cannot reach them).
    ``honoured``: the names of the ``torchrl.weight_update`` schemes the collector's
    transport honours (besides ``NoWeightSyncScheme``).
    """
    if schemes is not None and updater is not None:
        raise TypeError(f"{owner}() takes weight_sync_schemes or weight_updater, not both; drop weight_updater")
    if updater is not None:
        return WeightSync(True, True, None, _check_updater(owner, updater, workers=workers, suggest=honoured[-1]))
    if schemes is None:
        return DEFAULT_SYNC
    if not isinstance(schemes, Mapping):
        raise TypeError(f"weight_sync_schemes must be a dict {{'policy': scheme}}, got {schemes!r}")
    for key in schemes:
        if key != "policy":
            raise ValueError(
                f"weight_sync_schemes syncs the policy only (key 'policy'), got key {key!r}: {owner}'s workers "
                "hold no other model; drop it"
            )
    scheme = schemes.get("policy")
    if scheme is None:
        return WeightSync(True, True, dict(schemes))
    base = _torchrl_class(_SCHEMES, "WeightSyncScheme")
    if base is None or not isinstance(scheme, base):
        raise TypeError(
            f"weight_sync_schemes['policy'] must be a TorchRL WeightSyncScheme (e.g. SharedMemWeightSyncScheme()), "
            f"got {scheme!r}"
        )
    import torchrl.weight_update as schemes_module

    if isinstance(scheme, schemes_module.NoWeightSyncScheme):
        return WeightSync(False, True, dict(schemes))
    if type(scheme) not in tuple(getattr(schemes_module, name) for name in honoured):
        choices = ", ".join(f"{name}()" for name in honoured)
        raise NotImplementedError(
            f"weight_sync_schemes['policy'] is a {type(scheme).__name__}, whose transport {owner} cannot honour; "
            f"pass {choices} or NoWeightSyncScheme() (or none)"
        )
    return WeightSync(True, bool(getattr(scheme, "sync", True)), dict(schemes))


def check_recv_schemes(owner: str, schemes: Any) -> None:
    """Refuse TorchRL's ``weight_recv_schemes`` (only ``None`` is accepted), before anything starts."""
    if schemes is not None:
        raise NotImplementedError(
            f"{owner} cannot take weight_recv_schemes={schemes!r}: receiving weights from a parent process needs "
            "TorchRL's scheme receivers, which aiocollect's collectors do not run; drop it and send weights with "
            "update_policy_weights_()"
        )


def _check_updater(owner: str, updater: Any, *, workers: bool, suggest: str) -> Any:
    base = _torchrl_class(_UPDATERS, "WeightUpdaterBase")
    is_class = isinstance(updater, type) and base is not None and issubclass(updater, base)
    if base is None or not (is_class or isinstance(updater, base) or callable(updater)):
        raise TypeError(f"weight_updater must be a TorchRL WeightUpdaterBase or its constructor, got {updater!r}")
    if workers:
        raise NotImplementedError(
            f"{owner} cannot drive weight_updater= (TorchRL's deprecated WeightUpdaterBase): its push reaches "
            "TorchRL's worker pipes, which aiocollect's workers do not have; drop it (update_policy_weights_() "
            f"syncs every worker) or pass weight_sync_schemes={{'policy': {suggest}()}}"
        )
    if not isinstance(updater, base):
        updater = updater()  # TorchRL's rule: a constructor is called with no argument
        if not isinstance(updater, base):
            raise TypeError(f"weight_updater() must build a TorchRL WeightUpdaterBase, got {updater!r}")
    warnings.warn(
        "weight_updater= (TorchRL's WeightUpdaterBase) is deprecated in TorchRL; pass weight_sync_schemes instead",
        DeprecationWarning,
        stacklevel=4,
    )
    return updater


def _worker_list(worker_ids: Any, num_workers: int) -> tuple[int, ...] | None:
    if worker_ids is None:
        return None
    ids = list(worker_ids) if isinstance(worker_ids, (list, tuple)) else [worker_ids]
    for w in ids:
        if isinstance(w, bool) or not isinstance(w, int):
            raise TypeError(f"worker_ids must be a worker index or a list of them, got {worker_ids!r}")
        if not 0 <= w < num_workers:
            raise ValueError(f"worker_ids must be in range({num_workers}), got {worker_ids!r}; name existing workers")
    return tuple(sorted(set(ids)))


def _per_worker(source: Any, num_workers: int) -> dict[int, Any] | None:
    """``{worker: weights}`` (TorchRL's per-worker form), or None if ``source`` is weights."""
    if not isinstance(source, Mapping) or hasattr(source, "flatten_keys") or len(source) == 0:
        return None  # weights (a TensorDict has no truth value: checked first)
    if not all(isinstance(k, int) and not isinstance(k, bool) for k in source):
        return None
    bad = sorted(k for k in source if not 0 <= k < num_workers)
    if bad:
        raise ValueError(f"per-worker weights name workers {bad}, but the workers are range({num_workers})")
    return dict(source)


def parse_update(
    sync: WeightSync,
    num_workers: int,
    policy_or_weights: Any,
    *,
    weights: Any,
    policy: Any,
    worker_ids: Any,
    model_id: Any,
    weights_dict: Any,
) -> WeightUpdate | None:
    """Resolve ``update_policy_weights_``'s arguments as TorchRL does; ``None``: nothing to send.

    Raises:
        ValueError: Conflicting forms (two weight sources, ``weights_dict`` with ``model_id``...).
        KeyError: ``model_id`` (or a ``weights_dict`` key) names a model this collector does not sync.
    """
    given = [(n, v) for n, v in (("policy_or_weights", policy_or_weights), ("weights", weights), ("policy", policy))]
    given = [(n, v) for n, v in given if v is not None]
    if len(given) > 1:
        raise ValueError(
            f"update_policy_weights_() takes one source of weights, got {' and '.join(n for n, _ in given)}; "
            "pass only one"
        )
    source = given[0][1] if given else None
    if weights_dict is not None:
        if model_id is not None or source is not None:
            raise ValueError(
                "update_policy_weights_(weights_dict=) names its models itself: drop model_id and the other weights"
            )
        if not isinstance(weights_dict, Mapping):
            raise TypeError(f"weights_dict must be a dict {{model_id: weights}}, got {weights_dict!r}")
    if sync.updater is not None:
        if weights_dict is not None or model_id is not None:
            raise ValueError("model_id and weights_dict are not supported with weight_updater=; drop them")
        return WeightUpdate(source, None, None, worker_ids)
    models = list(weights_dict) if weights_dict is not None else ["policy" if model_id is None else model_id]
    for model in models:
        if model != "policy":
            raise KeyError(
                f"model {model!r} is not synced by this collector: it syncs 'policy' only; use model_id='policy'"
            )
    if weights_dict is not None:
        if not weights_dict:
            return None
        source = weights_dict["policy"]
    if not sync.enabled:
        return None
    per_worker = _per_worker(source, num_workers)
    if per_worker is not None and worker_ids is not None:
        raise ValueError("per-worker weights {worker: weights} name their workers: drop worker_ids")
    workers = tuple(sorted(per_worker)) if per_worker is not None else _worker_list(worker_ids, num_workers)
    return WeightUpdate(None if per_worker is not None else source, per_worker, workers, worker_ids)


class WeightSyncAPI:
    """Mixin of every collector: TorchRL's policy-version accessors and scheme attribute.

    A collector calls `_init_weight_sync` from its constructor and implements `_send_update`.
    """

    _weight_sync: WeightSync

    def _policy_version(self) -> int:
        raise NotImplementedError

    def _init_weight_sync(self, owner: str, schemes: Any, updater: Any, *, workers: bool) -> None:
        self._weight_sync = resolve_weight_sync(owner, schemes, updater, workers=workers)
        if self._weight_sync.updater is not None:
            self._weight_sync.updater.register_collector(self)

    def _num_weight_targets(self) -> int:
        """How many workers hold a policy (``worker_ids`` index them)."""
        return 1

    async def _send_update(self, update: WeightUpdate) -> None:
        raise NotImplementedError

    @property
    def policy_version(self) -> int:
        """The collector's policy version: ``0`` at start, ``+1`` per weight update (restored by `load_state_dict`).

        Unlike TorchRL's (``None`` unless ``track_policy_version``), it is always counted; frames
        hold the version that collected them in ``("collector", "policy_version")``.
        """
        return self._policy_version()

    def get_policy_version(self) -> int:
        """Return `policy_version` (TorchRL's method form, for remote calls)."""
        return self._policy_version()

    @property
    def _weight_sync_schemes(self) -> dict[str, Any] | None:
        # TorchRL's attribute, read by code written for its collectors: the schemes as given, or
        # the scheme TorchRL gives such a collector by default.
        sync, default = self._weight_sync, self._default_scheme()
        if sync.schemes is not None or default is None:
            return sync.schemes
        cls = _torchrl_class("torchrl.weight_update", default)
        if cls is None:
            return None
        self._weight_sync = WeightSync(sync.enabled, sync.wait, {"policy": cls()}, sync.updater)
        return self._weight_sync.schemes

    def _default_scheme(self) -> str | None:
        """The ``torchrl.weight_update`` scheme TorchRL gives this collector by default (``None``: none)."""
        return None


class WeightUpdates(WeightSyncAPI):
    """Mixin of the collectors that take every form of TorchRL's ``update_policy_weights_``."""

    async def update_policy_weights_(
        self,
        policy_or_weights: Any = None,
        *,
        weights: Any = None,
        policy: Any = None,
        worker_ids: Any = None,
        model_id: str | None = None,
        weights_dict: dict[str, Any] | None = None,
    ) -> None:
        """Bring the collection policy up to date and bump `policy_version`.

        Without weights, they come from the ``policy`` given to the constructor: an in-process
        collector refreshes its device copy (a policy that was not copied is the live module);
        a multi-worker or node collector sends its current weights. Workers and nodes apply
        them between batches, never during one, and frames record the version they were
        collected with in ``("collector", "policy_version")``. A worker or node collector
        returns once every live worker it updated that had no batch in progress acknowledged
        (unless the scheme says ``sync=False``); a worker in the middle of a batch loads the
        update before its next one, unwaited. A weight update overtakes the batches a worker
        has queued but not started. Nodes that build their policy with ``policy_factory``
        (no ``policy=``) take the layout of every update from the first weights given
        (TorchRL's lazy weight sync). With ``NoWeightSyncScheme`` the call does nothing.

        Args:
            policy_or_weights: An ``nn.Module``, a TensorDict (``TensorDict.from_module``) or a
                state dict; ``{worker: weights}`` gives workers weights of their own (distinct
                ``policy_factory`` policies; node collectors send one set per call); ``None``
                reads the constructor's ``policy``.
            weights: Same as ``policy_or_weights`` (TorchRL's keyword).
            policy: An ``nn.Module`` to take the weights from (TorchRL's keyword).
            worker_ids: Update only these workers or nodes (an index or a list of them); the
                others keep their weights and version. A node that starts or restarts later
                starts from the newest weights sent to any node.
            model_id: The model to update: ``"policy"`` (the default, and the only one synced).
            weights_dict: ``{model_id: weights}``, instead of ``model_id`` and the weights.

        Raises:
            ValueError: Conflicting forms (two weight sources, ``weights_dict`` with ``model_id``...),
                or ``{node: weights}`` given to a node collector.
            KeyError: ``model_id`` names a model the collector does not sync, or weights miss entries.
            RuntimeError: No weights were given and the policy is not an ``nn.Module`` (TorchRL's
                "No weight updater..." error).
            TypeError: Explicit weights, and no ``nn.Module`` in the workers or nodes to load them into.
            TimeoutError: Workers did not acknowledge within ``weight_sync_timeout`` (named).
        """
        update = parse_update(
            self._weight_sync, self._num_weight_targets(), policy_or_weights, weights=weights, policy=policy,
            worker_ids=worker_ids, model_id=model_id, weights_dict=weights_dict,
        )  # fmt: skip
        if update is not None:
            await self._send_update(update)
