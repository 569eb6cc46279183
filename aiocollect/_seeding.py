"""Seed derivation shared by every collector: one ``SeedSequence`` tree, no ``seed + i``."""

from __future__ import annotations

import numpy as np
import torch

from ._validate import check_int

__all__ = ["SeedPlan", "check_seed"]


def check_seed(seed: object) -> int:
    return check_int("seed", seed, minimum=0, rule="a non-negative int")  # type: ignore[no-any-return]


class SeedPlan:
    """Independent streams derived from one ``SeedSequence``: envs, random actions, torch.

    Args:
        seq: The sequence this collector (or worker) owns.
    """

    def __init__(self, seq: np.random.SeedSequence) -> None:
        self.env_seq, action, torch_seq, self.next_seq = seq.spawn(4)
        self.action_seed = int(action.generate_state(1)[0])
        self.torch_seed = int(torch_seq.generate_state(1)[0])

    def env_seeds(self, n: int) -> list[int]:
        """One seed per env, from independent child sequences."""
        return [int(s.generate_state(1)[0]) for s in self.env_seq.spawn(n)]

    def apply_rngs(self, generator: torch.Generator) -> None:
        """Seed the random-action generator and torch's global RNG (for stochastic policies)."""
        generator.manual_seed(self.action_seed)
        torch.manual_seed(self.torch_seed)

    def next_seed(self) -> int:
        """A seed for chaining into another collector."""
        return int(self.next_seq.generate_state(1)[0])
