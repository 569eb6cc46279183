"""Collectors in this process: the lifecycle every collector shares, background collection,
the batch pipeline, trajectory assembly, `Collector` and the blocking base class.

Layers, lowest first: _core, _envs, _buffer, _rollout, _workers, _collect, _multi. A module
imports only from its own layer or lower ones (tests/test_layout.py).
"""
