"""Multi-worker collectors: the engine that drives a worker transport, the event pump,
liveness, argument handling, and MultiSync/MultiAsync/AsyncCollector.

Layers, lowest first: _core, _envs, _buffer, _rollout, _workers, _collect, _multi. A module
imports only from its own layer or lower ones (tests/test_layout.py).
"""
