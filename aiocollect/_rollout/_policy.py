"""Policy adapter: one call signature for ``None``, plain ``nn.Module``s and TensorDict callables.

tensordict is imported only for TensorDict policies: a worker process that runs a plain
module never loads it.
"""

from __future__ import annotations

import copy
import inspect
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._envs._specs import EnvSpec, NestedKey

__all__ = ["NO_ROUTE", "PolicyAdapter", "require_materialized"]

#: TorchRL's words for a weight update with nowhere to go (``BaseCollector._maybe_fallback_update``).
NO_ROUTE = "No weight updater, WeightSyncScheme, or concrete local policy update path is configured for this collector"

Outputs = dict[NestedKey, torch.Tensor]


def _tensordict_loaded() -> bool:
    # An object whose class comes from tensordict cannot exist before tensordict was imported,
    # so while it is not in sys.modules no isinstance check against its classes is needed.
    return "tensordict" in sys.modules


def _is_tensordict_module(policy: Any) -> bool:
    if not _tensordict_loaded():
        return False
    from tensordict.nn import TensorDictModuleBase

    return isinstance(policy, TensorDictModuleBase)


def _takes_tensordict(fn: Any) -> bool:
    # TorchRL's rule: a module whose forward takes a single TensorDict-typed argument is a
    # TensorDict policy even if it is not a TensorDictModule.
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if len(params) != 1:
        return False
    ann = params[0].annotation
    if isinstance(ann, str):
        return "TensorDict" in ann
    if not _tensordict_loaded():
        return False
    from tensordict import TensorDict, TensorDictBase

    return ann in (TensorDict, TensorDictBase)


def _is_tensordict(value: Any) -> bool:
    if not _tensordict_loaded():
        return False
    from tensordict import TensorDictBase

    return isinstance(value, TensorDictBase)


def require_materialized(policy: Any, copied: str) -> None:
    """Refuse a module whose lazy parameters (``nn.LazyLinear``, ...) are not initialized yet.

    A copy of such a module initializes on its own, at its first forward pass, to weights the
    trainer's module never sees: the copy and the trainer would silently train and act with
    different networks (pytorch/rl#743).

    Args:
        policy: The policy about to be copied (anything but an ``nn.Module`` passes).
        copied: Who holds the copy, for the message (``"its workers' copies"``).

    Raises:
        ValueError: ``policy`` has uninitialized parameters or buffers; the message names them.
    """
    if not isinstance(policy, torch.nn.Module):
        return
    state = [*policy.named_parameters(), *policy.named_buffers()]
    lazy = [name for name, t in state if torch.nn.parameter.is_lazy(t)]
    if lazy:
        shown = ", ".join(lazy[:4]) + (f" and {len(lazy) - 4} more" if len(lazy) > 4 else "")
        raise ValueError(
            f"the policy has uninitialized lazy parameters ({shown}): {copied} would initialize apart from the "
            "trainer's module; run one forward pass on an observation (policy(obs)) before passing it"
        )


class PolicyAdapter:
    """Calls the user's policy on a dict of observation tensors and returns output tensors.

    The adapter owns the device copy (made only when the parameters live elsewhere) and the
    policy version. It never branches per step on the policy's kind: `__init__` picks `_call`
    (`bind` narrows a plain module's to the one-observation, one-action case).

    Args:
        policy: ``None`` (random actions), an ``nn.Module`` or callable taking the observation
            tensors, or a TensorDict callable (a ``TensorDictModule``, or a module whose
            ``forward`` takes one TensorDict-annotated argument).
        policy_device: Device to run the policy on; the module is copied there if needed.
        exploration_type: The interaction type TensorDict policies run under, as a
            ``tensordict.nn.InteractionType`` or its value (``"random"``, ``"mode"``, ...).
    """

    def __init__(self, policy: Any, *, policy_device: torch.device | None, exploration_type: Any) -> None:
        self.original = policy
        # Held around every policy call and weight update so an update never lands mid-forward.
        self.lock = threading.Lock()
        self.version = 0
        self.exploration_type = exploration_type
        self.device = policy_device
        self.policy = self._maybe_copy(policy, policy_device)
        self.is_random = policy is None
        self.trusted = False  # trust_policy=True: outputs are used as they come, unchecked
        self._interaction: Any = None
        if policy is None:
            self._call: Callable[[Outputs], Outputs] | None = None
            self._tensordict = False
        else:
            self._tensordict = (
                not isinstance(policy, torch.nn.Module)
                or _is_tensordict_module(policy)
                or (_takes_tensordict(policy.forward))
            )
            self._call = self._call_tensordict if self._tensordict else self._call_tensors
        if self._tensordict:
            # Only TensorDict policies read the interaction type, so only they import tensordict.
            from tensordict import TensorDict
            from tensordict.nn import InteractionType, set_interaction_type

            self._td_class, self._set_interaction = TensorDict, set_interaction_type
            et = exploration_type
            self._interaction = et if isinstance(et, InteractionType) else InteractionType(str(et).lower())

    @property
    def takes_tensordict(self) -> bool:
        """Whether the policy is called with a TensorDict (else with its observation tensors)."""
        return self._tensordict

    def bind_keys(self, obs_keys: list[NestedKey], action_keys: list[NestedKey]) -> None:
        """Learn the input and output keys without an env (an inference server's requests).

        A plain module takes ``obs_keys``' tensors, in order, and returns ``action_keys``'; a
        TensorDict policy reads and writes the keys it declares. Requests have one batch dim.
        """
        self._nb = 1
        self.obs_keys, self.action_keys = list(obs_keys), list(action_keys)

    def bind(self, spec: EnvSpec, *, counts_steps: bool = False) -> None:
        """Learn the env's observation and action keys (called once the env exists).

        ``counts_steps`` says the collector writes ``"step_count"`` itself (``max_frames_per_traj``
        is set); otherwise an env may own that key (a TorchRL ``StepCounter``).
        """
        reserved = {"next", "collector", "reward", "done", "terminated", "truncated", *spec.action}
        if counts_steps:
            reserved.add("step_count")
        clash = sorted(str(k) for k in spec.observation if (k if isinstance(k, str) else k[0]) in reserved)
        if clash:
            raise ValueError(
                f"observation keys {clash} clash with keys the collector writes ({sorted(map(str, reserved))}); "
                "rename them in the env (e.g. with a gymnasium ObservationWrapper)"
            )
        self.spec = spec
        self._nb = len(spec.batch_size)
        self.obs_keys = list(spec.observation)
        self.action_keys = list(spec.action)
        if (
            self._call == self._call_tensors
            and self.device is None
            and len(self.obs_keys) == len(self.action_keys) == 1
        ):
            self._obs_key, self._action_key = self.obs_keys[0], self.action_keys[0]
            self._call = self._call_one

    @staticmethod
    def _maybe_copy(policy: Any, device: torch.device | None) -> Any:
        if device is None or not isinstance(policy, torch.nn.Module):
            return policy
        tensors = list(policy.parameters()) + list(policy.buffers())
        if all(t.device == device for t in tensors):
            return policy
        # A copy on the policy device; update_policy_weights_() refreshes it from the original.
        return copy.deepcopy(policy).to(device)

    def _to_policy(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.device is None else t.to(self.device, non_blocking=True)

    def _call_one(self, obs: Outputs) -> Outputs:
        # The common case (one observation, one action, no device move), without the loops.
        return {self._action_key: self.policy(obs[self._obs_key])}

    def _call_tensors(self, obs: Outputs) -> Outputs:
        out = self.policy(*[self._to_policy(obs[k]) for k in self.obs_keys])
        if len(self.action_keys) == 1:
            return {self.action_keys[0]: out}
        if isinstance(out, Mapping):
            return dict(out)
        return dict(zip(self.action_keys, out, strict=True))

    def _call_tensordict(self, obs: Outputs) -> Outputs:
        # The env batch, or the envs a barrier-free step serves: the observations' leading dims.
        batch = next(iter(obs.values())).shape[: self._nb] if obs else self.spec.batch_size
        # On the policy device, and saying so (TorchRL's policies read td.device).
        td = self._td_class({k: self._to_policy(v) for k, v in obs.items()}, batch_size=batch, device=self.device)
        with self._set_interaction(self._interaction):
            result = self.policy(td)
        result = td if result is None else result
        return {k: v for k, v in result.items(include_nested=True, leaves_only=True) if k not in obs}

    def __call__(self, obs: Outputs, versions: list[int]) -> Outputs:
        """Run the policy without gradients (TensorDict policies under the interaction type).

        Appends the policy version used to ``versions`` under the same lock as the call.
        Callers that already run under ``torch.no_grad()`` (the rollout, around a whole batch)
        do not pay for entering it again.
        """
        with self.lock:
            versions.append(self.version)
            if torch.is_grad_enabled():
                with torch.no_grad():
                    return self._call(obs)  # type: ignore[misc]
            return self._call(obs)  # type: ignore[misc]

    def check(self, out: Outputs, batch: tuple[int, ...] | None = None) -> None:
        """Validate the first output against the action spec (raises ``PolicyOutputError``).

        ``batch``: the leading dims the output has (default: the env's batch size).
        """
        from .._core._errors import PolicyOutputError

        if self.trusted:
            return
        for key, spec in self.spec.action.items():
            if key not in out:
                raise PolicyOutputError(
                    f"policy output must contain the action key {key!r}, got keys {sorted(map(str, out))}; "
                    f"write the action under {key!r}"
                )
            spec.check(key, out[key], tuple(self.spec.batch_size) if batch is None else batch)

    def update_weights(self, weights: Any = None, *, updater: Any = None, worker_ids: Any = None) -> None:
        """Load ``weights`` (module, state dict or TensorDict) or refresh the device copy; bump the version.

        With ``updater`` (TorchRL's ``WeightUpdaterBase``), it pushes the weights instead:
        ``updater(policy_or_weights=weights, worker_ids=worker_ids)``.
        """
        with self.lock:
            if updater is not None:
                updater(policy_or_weights=weights, worker_ids=worker_ids)
                self.version += 1
            else:
                self._update_weights(weights)

    def _update_weights(self, weights: Any) -> None:
        target = self.policy
        if weights is None and self.original is None:
            # A callable runs here as it is (its weights are live); random actions have none.
            raise RuntimeError(
                f"{NO_ROUTE}: it collects with random actions (policy=None), which have no weights; pass a policy"
            )
        if weights is not None:
            if target is None or not isinstance(target, torch.nn.Module):
                raise TypeError(
                    f"explicit weights need an nn.Module policy to load into, got {type(target).__name__}; "
                    "collect with an nn.Module policy (e.g. a TensorDictModule)"
                )
            if isinstance(weights, torch.nn.Module):
                weights = weights.state_dict()
            if _is_tensordict(weights):
                weights.to_module(target)
            else:
                target.load_state_dict(weights)
        elif target is not self.original and isinstance(target, torch.nn.Module):
            target.load_state_dict(self.original.state_dict())
        self.version += 1
