"""Serving one policy to many asyncio callers on dynamic batches: `InferenceServer`.

Layer 5 of 9 (after ``_rollout``, whose policy adapter it uses; before ``_workers``).
"""
