"""Shared helpers for the contract suites: fresh names, condition waits (`tests.helpers`), the test broker.

They are handed out as fixtures (returning the function) rather than imported, so no
test module depends on which `conftest` happens to be importable.
"""
from __future__ import annotations

import os
import uuid
from typing import Callable

import pytest

from tests.helpers import wait_until


def fresh(prefix: str) -> str:
    """A name no other test (or earlier run against the same broker) has used."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def kafka_test_servers() -> list[str]:
    """The broker named by LEDGERLM_TEST_KAFKA (kafka://host:port[,...]); fails the test if unusable.

    Called inside each test so a missing broker reads as a failing test, never a skip.
    """
    url = os.environ.get("LEDGERLM_TEST_KAFKA", "")
    if not url.startswith("kafka://") or not url[len("kafka://"):]:
        pytest.fail("LEDGERLM_TEST_KAFKA is not set to kafka://host:port; start the broker with "
                    "`infra/services.sh up kafka` and load `.local/services.env` before running the tests",
                    pytrace=False)
    return url[len("kafka://"):].split(",")


@pytest.fixture(name="fresh")
def _fresh() -> Callable[[str], str]:
    return fresh


@pytest.fixture(name="wait_for")
def _wait_for():
    """`tests.helpers.wait_until`: `wait_for(condition, timeout_s=..., what=..., every_s=...)`."""
    return wait_until


@pytest.fixture(name="kafka_test_servers")
def _kafka_test_servers() -> Callable[[], list[str]]:
    return kafka_test_servers
