"""The policy of a TorchRL rollout, prepared and called as TorchRL's collector does.

``None`` becomes a ``RandomPolicy`` over the env's full action spec (a ``RandomPolicy()``
without a spec gets the env's); a module that does not read TensorDicts is wrapped by
TorchRL's own rule (a ``TensorDictModule`` from the observation keys to the action keys)
unless ``trust_policy``; exploration modules without a spec get the env's. Its outputs are
written into the carrier as it returns them: no dtype or shape is imposed. The policy runs
under the collector's lock (a weight update never lands mid-forward) and records the
version it ran with.
"""

from __future__ import annotations

from typing import Any

import torch

from .._envs._torchrl import TorchRLEnv
from ._policy import PolicyAdapter

__all__ = ["TorchRLPolicy"]


class TorchRLPolicy:
    """Wraps the adapter's policy for a TorchRL env (see the module docstring).

    Args:
        adapter: The collector's `PolicyAdapter` (its ``policy`` is the module weight updates load).
        env: The `TorchRLEnv`.
        options: The rollout's `TorchRLOptions`.

    Raises:
        TypeError: The policy cannot be wrapped (TorchRL's rule); ``trust_policy=True`` skips it.
    """

    def __init__(self, adapter: PolicyAdapter, env: TorchRLEnv, options: Any) -> None:
        from tensordict.nn import CudaGraphModule, InteractionType
        from torchrl.envs.utils import _make_compatible_policy
        from torchrl.modules.tensordict_module.exploration import (
            RandomPolicy,
            set_exploration_modules_spec_from_env,
        )

        self.adapter, self.options = adapter, options
        base = env.env
        policy = adapter.policy
        if policy is None:
            policy = RandomPolicy(base.full_action_spec)
        if isinstance(policy, RandomPolicy):
            policy.set_action_spec_from_env(base)
        trust = options.trust_policy
        if trust is None:
            trust = isinstance(policy, (RandomPolicy, CudaGraphModule))
        if not trust:
            try:
                policy = _make_compatible_policy(policy=policy, observation_spec=base.observation_spec, env=base)
            except (TypeError, AttributeError, ValueError) as exc:
                raise TypeError(
                    f"the policy {type(policy).__name__} cannot be wrapped for this env ({exc}); give a TensorDict "
                    "module, or pass trust_policy=True if it reads and writes the env's TensorDicts as it is"
                ) from exc
        if isinstance(adapter.policy, torch.nn.Module):
            set_exploration_modules_spec_from_env(adapter.policy, base)
        self.wrapped = self._compiled(policy)
        self.exploration = InteractionType(options.exploration_type)
        self.out_keys: list[Any] = []
        self._base = base
        self._to_policy = options.policy_device is not None and options.policy_device != base.device
        self._to_env = self._to_policy and base.device is not None

    def _compiled(self, policy: Any) -> Any:
        o = self.options
        if o.compile_policy not in (None, False):
            from torchrl._utils import compile_with_warmup

            policy = compile_with_warmup(policy, **(o.compile_policy if isinstance(o.compile_policy, dict) else {}))
        if o.cudagraph_policy not in (None, False):
            from tensordict.nn import CudaGraphModule

            kwargs = o.cudagraph_policy if isinstance(o.cudagraph_policy, dict) else {}
            # On a machine without CUDA, CudaGraphModule warns and passes calls through (TorchRL's behaviour).
            policy = CudaGraphModule(policy, in_keys=[], out_keys=[], device=o.policy_device, **kwargs)
        return policy

    def setup(self, carrier: Any, *, with_template: bool = True) -> Any:
        """Find the keys the policy writes (a dry run, as TorchRL's); return one frame's template (or None)."""
        from tensordict import TensorDictBase

        wrapped, base = self.wrapped, self._base
        declared = list(getattr(wrapped, "out_keys", None) or [])
        with torch.no_grad():
            template = base.fake_tensordict() if with_template else None
            policy_input = carrier.copy()
            if self._to_policy:
                policy_input = policy_input.to(self.options.policy_device)
            before, before_values = policy_input.copy(), policy_input.clone()
            with _exploration(self.exploration):
                output = wrapped(policy_input)
            if output is None:
                output = policy_input

            # TorchRL's rule: an entry is the policy's if it is new, or a new tensor with new values.
            # apply() walks lazily stacked (heterogeneous) outputs, which items() cannot.
            def written(value: Any, old: Any, old_values: Any) -> Any:
                if old is None or (
                    value is not old
                    and (value.device != old_values.device or bool((~torch.isclose(value, old_values)).any()))
                ):
                    return value
                return None

            changed = output.apply(written, before, before_values, default=None, filter_empty=True)
            present = set(output.keys(True, True))
            keys = list(dict.fromkeys([*changed.keys(True, True), *(k for k in declared if k in present)]))
            self.out_keys = [k for k in keys if not (isinstance(k, tuple) and k[0] == "collector")]
            if template is not None:
                picked = output.select(*self.out_keys, strict=False)
                if isinstance(picked, TensorDictBase) and picked.device != template.device:
                    picked = picked.to(template.device) if template.device is not None else picked.clear_device_()
                template.update(picked)
        return template

    def __call__(self, carrier: Any, versions: list[int]) -> None:
        """Run the policy on ``carrier`` (policy device) and write its outputs into it."""
        adapter = self.adapter
        policy_input = carrier.to(self.options.policy_device, non_blocking=True) if self._to_policy else carrier
        with adapter.lock:
            versions.append(adapter.version)
            output = self.wrapped(policy_input)
        if output is not None and output is not carrier:
            carrier.update(output, keys_to_update=self.out_keys)

    def to_env(self, carrier: Any) -> Any:
        """The carrier on the env's device (a copy only when the policy runs elsewhere)."""
        return carrier.to(self._base.device, non_blocking=True) if self._to_env else carrier


def _exploration(kind: Any) -> Any:
    from torchrl.envs.utils import set_exploration_type

    return set_exploration_type(kind)
