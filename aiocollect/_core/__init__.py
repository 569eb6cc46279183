"""Foundations every layer uses: errors, argument checks, event-loop detection, threads, the
blocking portal, statistics records, notifications, seeding and shared-memory blocks.

Layers, lowest first: _core, _envs, _buffer, _rollout, _workers, _collect, _multi. A module
imports only from its own layer or lower ones (tests/test_layout.py).
"""
