"""The `case` fixture: every value set of chart_cases.CASES."""

from __future__ import annotations

from typing import Any

import pytest
from chart_cases import CASES


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param, CASES[request.param]
