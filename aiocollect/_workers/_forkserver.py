"""Imported last by the fork server's preload, never by anything else: freeze its heap.

Every worker is forked from the fork server after it imported torch and the worker loop
(hundreds of thousands of objects). Without this, the first garbage collection in each
worker walks all of them (about 0.15 s on a small machine) and touches their pages, which
copy-on-write then duplicates. `gc.freeze` moves them to a generation that is never
collected.
"""

from __future__ import annotations

import gc

gc.collect()
gc.freeze()
