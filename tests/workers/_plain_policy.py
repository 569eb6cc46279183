"""A policy whose module imports torch alone: workers that unpickle it load nothing else."""

from __future__ import annotations

import torch


class ArgmaxPolicy(torch.nn.Module):
    """CartPole actions from a plain 64-64 MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation).argmax(-1)
