"""Mapping between gymnasium spaces and aiocollect specs / tensors.

A space is flattened once into a list of leaves ``(key, path, spec, space)``; per step the
converters only walk those paths, so no space introspection happens on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from .._core._errors import EnvOutputError
from ._base import obs_label, output_shape_error
from ._specs import ArraySpec, NestedKey

__all__ = [
    "Leaf",
    "OneHotDiscrete",
    "Source",
    "fast_row_writer",
    "flatten_space",
    "obs_shape_error",
    "to_gym_action",
    "write_obs",
    "write_row",
]


@dataclass
class Leaf:
    key: NestedKey
    path: tuple[Any, ...]  # indices into the (possibly nested) gymnasium value
    spec: ArraySpec
    space: spaces.Space[Any]
    one_hot: bool
    start: Any  # Discrete.start / MultiDiscrete.start offset, or None
    convert: Callable[[Any], torch.Tensor] = lambda a: torch.as_tensor(a)

    def __post_init__(self) -> None:
        self.convert = _converter(self)


def _join(prefix: tuple[str, ...], name: str) -> tuple[str, ...]:
    return (*prefix, name)


def _as_key(parts: tuple[str, ...]) -> NestedKey:
    return parts[0] if len(parts) == 1 else parts


class OneHotDiscrete(spaces.Discrete):
    """A ``Discrete`` space whose values travel one-hot in batches (a TorchRL ``OneHot`` spec)."""


def flatten_space(space: spaces.Space[Any], root: str, *, one_hot: bool = False) -> list[Leaf]:
    """Flatten a gymnasium space into leaves.

    A top-level ``Dict`` space maps to top-level keys (TorchRL's convention for observations);
    nested ``Dict``/``Tuple`` spaces become nested keys (tuple members are named "0", "1", ...).
    """
    leaves: list[Leaf] = []

    def visit(sp: spaces.Space[Any], key: tuple[str, ...], path: tuple[Any, ...]) -> None:
        if isinstance(sp, spaces.Dict):
            for name, sub in sp.spaces.items():
                visit(sub, _join(key, str(name)), (*path, name))
        elif isinstance(sp, spaces.Tuple):
            for i, sub in enumerate(sp.spaces):
                visit(sub, _join(key, str(i)), (*path, i))
        else:
            oh = one_hot or isinstance(sp, OneHotDiscrete)
            spec, start = _leaf_spec(sp, oh)
            leaves.append(Leaf(_as_key(key), path, spec, sp, oh and spec.kind == "one_hot", start))

    top: tuple[str, ...] = () if isinstance(space, spaces.Dict) and root == "observation" else (root,)
    visit(space, top, ())
    return leaves


def _leaf_spec(sp: spaces.Space[Any], one_hot: bool) -> tuple[ArraySpec, Any]:
    if isinstance(sp, spaces.Box):
        dtype = torch.from_numpy(np.zeros((), dtype=sp.dtype)).dtype
        low = torch.as_tensor(sp.low, dtype=torch.float64)
        high = torch.as_tensor(sp.high, dtype=torch.float64)
        return ArraySpec(tuple(sp.shape), dtype, "box", low, high), None
    if isinstance(sp, spaces.Discrete):
        n = int(sp.n)
        if one_hot:
            return ArraySpec((n,), torch.int64, "one_hot", n=n), int(sp.start)
        return ArraySpec((), torch.int64, "discrete", n=n), int(sp.start)
    if isinstance(sp, spaces.MultiDiscrete):
        nvec = torch.as_tensor(np.asarray(sp.nvec), dtype=torch.int64)
        return ArraySpec(tuple(sp.shape), torch.int64, "multi_discrete", nvec=nvec), np.asarray(sp.start)
    if isinstance(sp, spaces.MultiBinary):
        return ArraySpec(tuple(np.atleast_1d(sp.n).tolist()), torch.int8, "binary"), None
    raise TypeError(
        f"gymnasium space {sp!r} is not supported; use Box, Discrete, MultiDiscrete, MultiBinary, "
        "Dict or Tuple (wrap the env with a gymnasium.ObservationWrapper to convert it)"
    )


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        value = value[p]
    return value


def _converter(leaf: Leaf) -> Callable[[Any], torch.Tensor]:
    # torch cannot wrap numpy arrays with negative strides (np.flipud, img[::-1], ... are
    # valid observations), so views are made contiguous; contiguous arrays are not copied.
    # np.asarray(order="C") rather than np.ascontiguousarray, which turns a 0-d value (a
    # Discrete or shape-() Box observation) into shape (1,): shapes must come out as they came in.
    if leaf.spec.kind == "one_hot":
        n, start = leaf.spec.n, leaf.start
        assert n is not None, "a one_hot spec has n"
        # one_hot only takes int64 indices; a Discrete value may be any numpy integer type.
        return lambda a: torch.nn.functional.one_hot(torch.as_tensor(np.asarray(a, dtype=np.int64) - start), n)
    if leaf.start is not None and np.any(leaf.start != 0):
        start = leaf.start

        def shifted(a: Any) -> torch.Tensor:
            a = np.asarray(a)
            d = a - start
            # A MultiDiscrete start would broadcast a wrongly shaped value to the right shape:
            # hand back the value as it came, so the caller's shape check sees it.
            return torch.as_tensor(d if d.shape == a.shape else a, dtype=torch.int64)

        return shifted
    if leaf.spec.kind in ("discrete", "multi_discrete"):
        return lambda a: torch.from_numpy(np.asarray(a, dtype=np.int64, order="C"))
    return lambda a: torch.from_numpy(np.asarray(a, order="C"))


@dataclass(frozen=True)
class Source:
    """The env whose values are being written, as shape errors name it.

    ``env`` reads like ``"CartPole-v1 (gymnasium.Env)"``; ``space`` is the attribute that
    holds the per-env observation space (``"observation_space"`` or
    ``"single_observation_space"``).
    """

    env: str
    space: str


def obs_shape_error(
    src: Source, leaf: Leaf, value: Any, batch: tuple[int, ...], method: str, where: str = ""
) -> EnvOutputError:
    """The error for a gymnasium observation leaf ``value`` whose shape breaks the space's promise.

    Shapes are given as gymnasium sees them (before one-hot encoding); ``batch`` is ``()`` for
    one env's value and ``(num_envs,)`` for a vector env's batched value.
    """
    want = tuple(leaf.space.shape or ())
    space = src.space + "".join(f"[{p!r}]" for p in leaf.path)
    rule = f"its {space} promises {want}"
    if batch:
        rule += f" per env, {(*batch, *want)} for {batch[0]} envs"
    fix = f"fix the env or its {src.space}"
    return output_shape_error(src.env, obs_label(leaf.key), np.shape(value), method, rule, fix, where)


def write_obs(
    leaves: list[Leaf], value: Any, out: dict[NestedKey, torch.Tensor], src: Source, method: str, rows: Any = None
) -> None:
    """Copy a batched gymnasium observation into the preallocated tensors of ``out`` (in place).

    ``rows`` (a boolean numpy mask) selects the env rows to write; ``None`` writes all rows.
    A value whose shape is not the one ``out`` holds raises `EnvOutputError` (never reshaped).
    """
    for leaf in leaves:
        raw = _get(value, leaf.path) if leaf.path else value
        t = leaf.convert(raw)
        dst = out[leaf.key]
        if t.shape != dst.shape:
            raise obs_shape_error(src, leaf, raw, tuple(dst.shape[: dst.dim() - len(leaf.spec.shape)]), method)
        if rows is None:
            dst.copy_(t)
            continue
        try:  # numpy's masked copy costs a tenth of torch's (index_put) at a vector env's size
            dst_np, t_np = dst.numpy(), t.numpy()
        except TypeError:  # bfloat16 has no numpy dtype
            sel = torch.from_numpy(rows)
            dst[sel] = t[sel].to(dst.dtype)
        else:
            dst_np[rows] = t_np[rows]


def write_row(
    leaves: list[Leaf],
    value: Any,
    out: dict[NestedKey, torch.Tensor],
    row: int,
    src: Source,
    method: str,
    where: str = "",
) -> None:
    """Copy one env's gymnasium observation into row ``row`` of the tensors of ``out``.

    ``where`` says where the value came from when that is not the method's return value
    (e.g. ``" as info['final_obs'][3]"``); shape errors quote it.
    """
    for leaf in leaves:
        raw = _get(value, leaf.path)
        t = leaf.convert(raw)
        dst = out[leaf.key][row]
        if t.shape != dst.shape:
            raise obs_shape_error(src, leaf, raw, (), method, where)
        dst.copy_(t)


def to_gym_action(leaves: list[Leaf], action: dict[NestedKey, Any], single: bool) -> Any:
    """Turn the action tensors (or numpy arrays) into the value gymnasium's ``step`` expects."""

    def leaf_value(leaf: Leaf) -> Any:
        a = action[leaf.key]
        if isinstance(a, np.ndarray):
            arr = a.argmax(-1) if leaf.spec.kind == "one_hot" else a
        else:
            if a.requires_grad or a.device.type != "cpu":
                a = a.detach().cpu()
            if leaf.spec.kind == "one_hot":
                a = a.argmax(-1)
            arr = a.numpy()
        if leaf.start is not None:
            arr = arr + leaf.start
        if isinstance(leaf.space, spaces.Box):
            arr = arr.astype(leaf.space.dtype, copy=False)
        if single and isinstance(leaf.space, spaces.Discrete):
            return int(arr)
        return arr

    if len(leaves) == 1 and leaves[0].path == ():
        return leaf_value(leaves[0])
    root: Any = None
    for leaf in leaves:
        root = _insert(root, leaf.path, leaf_value(leaf))
    return _finalize(root)


def _insert(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    if node is None:
        node = {}
    node[path[0]] = _insert(node.get(path[0]), path[1:], value)
    return node


def _finalize(node: Any) -> Any:
    # Tuple spaces were recorded under int keys; gymnasium wants real tuples for them.
    if isinstance(node, dict):
        node = {k: _finalize(v) for k, v in node.items()}
        if node and all(isinstance(k, int) for k in node):
            return tuple(node[i] for i in range(len(node)))
    return node


def fast_row_writer(leaves: list[Leaf], out: dict[NestedKey, torch.Tensor]) -> Callable[[int, Any], bool] | None:
    """For the common observation (one Box array): ``dst[i] = obs`` through numpy, or False to decline.

    Anything else (nested spaces, Discrete values, a wrong shape, which the general path
    reports naming the env) goes through `write_row`; so does a dtype numpy lacks (bfloat16).
    """
    if len(leaves) != 1 or leaves[0].path != () or leaves[0].spec.kind != "box":
        return None
    try:
        dst = out[leaves[0].key].numpy()
    except TypeError:
        return None
    shape = leaves[0].spec.shape  # tuple(space.shape) of the Box space
    ndarray = np.ndarray

    def write(i: int, obs: Any) -> bool:
        if type(obs) is not ndarray or obs.shape != shape:
            return False
        dst[i] = obs
        return True

    return write
