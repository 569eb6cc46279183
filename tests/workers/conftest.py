"""Fixtures of the multi-worker tests: ``backend`` runs a test once per transport."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["inline", "subprocess"])
def backend(request: pytest.FixtureRequest) -> str:
    """The worker transport a test runs on: threads of this process, or worker processes."""
    return request.param  # type: ignore[no-any-return]
