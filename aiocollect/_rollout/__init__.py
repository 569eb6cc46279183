"""Stepping envs with a policy: the collector configuration, the policy adapter and the rollout
engine. Imported by worker processes, so nothing here imports tensordict at module level.

Layers, lowest first: _core, _envs, _buffer, _rollout, _workers, _collect, _multi. A module
imports only from its own layer or lower ones (tests/test_layout.py).
"""
