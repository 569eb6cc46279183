"""Environments: specs, the BatchedEnv / AsyncBatchedEnv protocol, gymnasium adapters and
AsyncEnvPool.

Layers, lowest first: _core, _envs, _buffer, _rollout, _workers, _collect, _multi. A module
imports only from its own layer or lower ones (tests/test_layout.py).
"""
