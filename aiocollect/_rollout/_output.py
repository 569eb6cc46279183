"""How a `Rollout`'s time-major storage becomes the ``[*B, T]`` batch a caller keeps.

The storage is ``[T, *B, ...]`` so each step writes one contiguous slice; `RolloutOutput`
moves time to the last batch dim while making the one copy the caller gets, adding the
per-frame policy version and worker id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ._arrays import next_key
from ._layout import BatchLayout

if TYPE_CHECKING:
    from tensordict import TensorDict

    from .._envs._specs import EnvSpec, NestedKey

__all__ = ["RolloutOutput", "version_column"]


class RolloutOutput:
    """Mixed into `Rollout` (whose storage these methods read), to keep its module small."""

    buf: dict[NestedKey, torch.Tensor] | None
    spec: EnvSpec
    B: tuple[int, ...]
    T: int
    nb: int
    versions: list[int]
    worker_id: int
    storing_device: torch.device | None
    compact: bool = False  # compact_obs: batches leave the next observations out
    hidden_keys: tuple[Any, ...] = ()  # kept for the collector, not delivered (track_provenance=False)
    pinned: frozenset[Any] = frozenset()  # storage entries in page-locked memory (see Rollout._keys_to_pin)

    def _kept(self) -> list[tuple[Any, torch.Tensor]]:
        """The storage entries batches hold: all but a root reward the env does not have.

        With ``compact`` (``compact_obs=True``) the next observations are left out too: each is
        the root observation of the following step.
        """
        assert self.buf is not None
        drop: set[Any] = set() if self.spec.root_reward else {("next", "reward")}
        if self.compact:
            drop |= {next_key(k) for k in self.spec.observation}
        return [(k, v) for k, v in self.buf.items() if k not in drop]

    def output_layout(self) -> BatchLayout:
        """Keys, shapes and dtypes of the batches `collect` produces (buffers must exist, see `prepare`)."""
        assert self.buf is not None
        shape = (*self.B, self.T)
        layout = [(k, (*shape, *v.shape[1 + self.nb :]), v.dtype) for k, v in self._kept()]
        layout += [(k, (*shape, 1), torch.bool) for k in ("done", "terminated", "truncated")]
        layout += [
            (("collector", "policy_version"), shape, torch.int64),
            (("collector", "worker_id"), shape, torch.int64),
        ]
        return BatchLayout(layout, shape=shape, hidden=self.hidden_keys)

    def fake_batch(self) -> TensorDict:
        """A zero-filled batch with the keys, shapes and dtypes `collect` gives (resets the env if needed)."""
        from tensordict import TensorDict

        if self.buf is None:
            self.prepare()  # type: ignore[attr-defined]
        dev = self.storing_device
        out = {k: torch.zeros(shape, dtype=dtype, device=dev) for k, shape, dtype in self.output_layout()}
        return TensorDict(out, batch_size=(*self.B, self.T), device=dev, names=[*([None] * self.nb), "time"])

    def _write_out(self, out: dict[Any, torch.Tensor], steps: int) -> None:
        """Copy the batch out of the time-major storage into ``out`` (e.g. a shared slot).

        ``steps < T`` (a preempted batch) zeroes the missing steps and marks them with
        trajectory id and policy version ``-1``, as TorchRL does.
        """
        assert self.buf is not None
        gpu = None
        for k, v in self._kept():
            o = out[k]
            if o.is_cuda and k in self.pinned:
                # The pinned host rows as they are, one DMA, then time moves to the back on the
                # GPU: a strided host source would first be gathered into a pageable temporary
                # and copied from there synchronously (43 MB of pixels: 1.0 ms against 6.0 ms
                # on an H200). A pageable source keeps the plain copy, which is faster for it.
                gpu = o.device
                v = v.to(gpu, non_blocking=True)
            o.copy_(v.movedim(0, self.nb))
        if gpu is not None:
            # The next batch rewrites these host rows from its first step on.
            torch.cuda.current_stream(gpu).synchronize()
        for k in ("done", "terminated", "truncated"):
            out[k].zero_()
        out[("collector", "policy_version")].copy_(version_column(self.versions, self.T))
        out[("collector", "worker_id")].fill_(self.worker_id)
        if steps < self.T:
            for v in out.values():
                v.narrow(self.nb, steps, self.T - steps).zero_()
            for k in (("collector", "traj_ids"), ("collector", "policy_version")):
                if k in out:
                    out[k].narrow(self.nb, steps, self.T - steps).fill_(-1)

    def _wrap(self, out: dict[Any, torch.Tensor] | None, steps: int) -> TensorDict:
        """`_write_out` into ``out`` (allocated if ``None``) and wrap it as a ``[*B, T]`` TensorDict."""
        from tensordict import TensorDict

        dev = self.storing_device
        given = out is not None
        if out is None:
            out = {k: torch.empty(shape, dtype=dtype, device=dev) for k, shape, dtype in self.output_layout()}
        self._write_out(out, steps)
        names = [*([None] * self.nb), "time"]
        # TensorDict's constructor without its checks, which the storage's layout already
        # guarantees: 8 us against 53 us for a batch's 13 entries. Not for tensors the caller
        # handed in with a device asked for: the checked constructor moves them there.
        new = getattr(TensorDict, "_new_unsafe", None)
        if new is None or (given and dev is not None):
            return TensorDict(out, batch_size=(*self.B, self.T), device=dev, names=names)
        # The device as the checked constructor names it: indexed ("cuda:0", not "cuda"), as
        # the tensors just allocated on it are.
        device = None if dev is None else next(iter(out.values())).device
        return _tree(new, _nested(out), torch.Size((*self.B, self.T)), device, names)


def version_column(versions: list[int], T: int) -> torch.Tensor:
    """The policy-version column: ``versions`` (one per step taken), then ``-1`` up to ``T``.

    Most batches run under one version: then two fills instead of converting a list of
    Python ints (80 us for 800 steps).
    """
    n = len(versions)
    if n and versions.count(versions[0]) == n:
        column = torch.full((T,), versions[0], dtype=torch.int64)
        if n < T:
            column[n:] = -1
        return column
    return torch.tensor(versions + [-1] * (T - n), dtype=torch.int64)


def _nested(flat: dict[Any, torch.Tensor]) -> dict[Any, Any]:
    """``{("next", "obs"): t}`` as ``{"next": {"obs": t}}``."""
    root: dict[Any, Any] = {}
    for k, v in flat.items():
        if isinstance(k, tuple):
            node = root
            for part in k[:-1]:
                node = node.setdefault(part, {})
            node[k[-1]] = v
        else:
            root[k] = v
    return root


def _tree(new: Any, tree: dict[Any, Any], batch: torch.Size, device: torch.device | None, names: list[Any]) -> Any:
    """``tree`` as a TensorDict made with ``new`` (``TensorDict._new_unsafe``), level by level.

    Bottom-up, so each level carries the batch's names: a nested dict handed over whole gets
    unnamed sub-TensorDicts.
    """
    data = {k: _tree(new, v, batch, device, names) if isinstance(v, dict) else v for k, v in tree.items()}
    return new(data, batch_size=batch, device=device, names=names)
