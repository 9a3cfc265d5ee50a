"""Fixtures shared by the e2e tests of the API on its own (no worker)."""
from __future__ import annotations

import pytest

from tests.e2e.api_alone import ApiAlone


@pytest.fixture(scope="module")
def api(tmp_path_factory, tiny_model_dir):
    """One API with its admission for the test module (`tests.e2e.api_alone.ApiAlone`)."""
    alone = ApiAlone(tmp_path_factory.mktemp("api-alone"), tiny_model_dir)
    yield alone
    alone.close()


from tests.e2e.console_fixture import console_platform  # noqa: E402,F401 - the console tests' shared platform
