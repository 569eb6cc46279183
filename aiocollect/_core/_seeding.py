"""What makes seeded runs reproducible: one ``SeedSequence`` tree (no ``seed + i``) and
trajectory ids that do not depend on timing."""

from __future__ import annotations

import threading

import numpy as np
import torch

from ._validate import check_int

__all__ = ["SeedPlan", "TrajCounter", "check_seed"]


def check_seed(seed: object) -> int:
    return check_int("seed", seed, minimum=0, rule="a non-negative int")


class SeedPlan:
    """Independent streams derived from one ``SeedSequence``: envs, random actions, torch.

    Args:
        seq: The sequence this collector (or worker) owns.
        given: The seed the user passed, for envs seeded with it as TorchRL does.
    """

    def __init__(self, seq: np.random.SeedSequence, given: int | None = None) -> None:
        self.given = given
        self.env_seq, action, torch_seq, self.next_seq = seq.spawn(4)
        self.action_seed = int(action.generate_state(1)[0])
        self.torch_seed = int(torch_seq.generate_state(1)[0])

    def env_seeds(self, n: int, as_given: bool = False) -> list[int]:
        """One seed per env, from independent child sequences.

        With ``as_given`` (a TorchRL env, which seeds its sub-envs itself from one seed), every
        env gets the user's seed unchanged, as ``torchrl``'s ``collector.set_seed`` gives it.
        """
        if as_given and self.given is not None:
            return [self.given] * n
        return [int(s.generate_state(1)[0]) for s in self.env_seq.spawn(n)]

    def apply_rngs(self, generator: torch.Generator) -> None:
        """Seed the random-action generator and torch's global RNG (for stochastic policies)."""
        generator.manual_seed(self.action_seed)
        torch.manual_seed(self.torch_seed)

    def next_seed(self) -> int:
        """A seed for chaining into another collector."""
        return int(self.next_seq.generate_state(1)[0])


class TrajCounter:
    """Hands out trajectory ids ``start, start + stride, ...``.

    Worker ``w`` of ``W`` counts with ``start=w, stride=W``: ids are unique across workers
    without any shared state, and do not depend on timing (so seeded runs are reproducible).
    """

    def __init__(self, start: int = 0, stride: int = 1) -> None:
        self.next, self.stride = start, stride
        self._lock = threading.Lock()

    def take(self, n: int) -> torch.Tensor:
        """The next ``n`` ids, as an int64 tensor."""
        return torch.from_numpy(self.take_np(n))

    def take_one(self) -> int:
        """The next id."""
        with self._lock:
            start, self.next = self.next, self.next + self.stride
        return start

    def take_np(self, n: int) -> np.ndarray:
        """The next ``n`` ids, as an int64 numpy array."""
        with self._lock:
            start, self.next = self.next, self.next + n * self.stride
        return np.arange(start, start + n * self.stride, self.stride, dtype=np.int64)
