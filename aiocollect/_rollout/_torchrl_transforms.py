"""Env transforms a TorchRL policy needs (``auto_register_policy_transforms``), as TorchRL adds them.

A recurrent policy reads ``is_init`` (an ``InitTracker``) and a state a ``TensorDictPrimer``
puts in the env's specs. With ``True`` the missing ones are appended to the env; with the
default ``None`` nothing is appended and a ``FutureWarning`` says which are missing (TorchRL
0.14 flips the default to ``True`` in 0.15); ``False`` does neither.

Only a policy that needs them is considered: one with a primer (a recurrent module) or one
that reads ``is_init``. TorchRL 0.14 counts a missing ``InitTracker`` for any module, so it
warns for plain feed-forward policies too; aiocollect does not.
"""

from __future__ import annotations

from typing import Any

from .._core._errors import warn_user
from .._envs._torchrl import TorchRLEnv

__all__ = ["register_policy_transforms"]


def register_policy_transforms(env: TorchRLEnv, policy: Any, flag: bool | None) -> None:
    """Append (``True``) or warn about (``None``) the transforms ``policy`` needs on ``env``."""
    if flag is False or policy is None:
        return
    from torchrl.modules.utils.utils import _compute_missing_env_transforms, get_primers_from_module

    reads_init = any((k if isinstance(k, str) else k[-1]) == "is_init" for k in getattr(policy, "in_keys", None) or ())
    if not reads_init and (
        not hasattr(policy, "apply") or get_primers_from_module(policy, warn=False, strict=False) is None
    ):
        return
    missing = _compute_missing_env_transforms(env.env, policy)
    if not missing:
        return
    if flag:
        for transform in missing:
            env.env = env.env.append_transform(transform)
        return
    names = ", ".join(type(t).__name__ for t in missing)
    warn_user(
        f"the env is missing transforms the policy needs ({names}); from torchrl 0.15 collectors append them "
        "themselves: pass auto_register_policy_transforms=True to append them now (and silence this warning), "
        "or auto_register_policy_transforms=False to opt out",
        FutureWarning,
    )
