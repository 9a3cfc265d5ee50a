"""Schemathesis over the whole OpenAPI schema, against the platform served over HTTP (a
fake engine serves what is admitted), with the keys of two tenants and of a platform
admin in turn: no response is a 5xx, and every response matches what the schema says of
its route (status, content type, body). Each operation gets a few valid and a few invalid
requests, without shrinking, so the run ends in a minute or two on a loaded machine.

Driven through schemathesis' strategies rather than its pytest plugin (whose lazy
fixture loader does not run on pytest 9); every failure is collected, then reported."""
from __future__ import annotations

import itertools

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance, response_schema_conformance, status_code_conformance,
)

from tests.e2e.fake_platform import fake_platform

EXAMPLES = 8  # per operation and mode: ~40 operations, each request a few ms to a few tens of ms
CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]
SCOPES = ("generate", "batch", "usage", "audit")


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory, tiny_model_dir):
    platform, runner = fake_platform(tmp_path_factory.mktemp("api-fuzz"), tiny_model_dir)
    keys = [platform.tenant(scopes=SCOPES)[1], platform.tenant(scopes=SCOPES)[1],
            platform.tenant(scopes=(*SCOPES, "admin"))[1]]
    platform.keys = itertools.cycle(keys)
    yield platform
    platform.check()
    platform.close()
    runner.close()


def _fuzz(operation, mode: GenerationMode, keys, failures: list[str]) -> int:
    sent = 0

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(operation.as_strategy(generation_mode=mode))
    def run(case):
        nonlocal sent
        sent += 1
        response = case.call(headers={"Authorization": f"Bearer {next(keys)}"}, timeout=30)
        where = f"{mode.value} {case.method} {case.formatted_path}"
        if response.status_code >= 500:
            failures.append(f"{where} -> {response.status_code}: {response.text[:300]}")
            return
        try:
            case.validate_response(response, checks=CHECKS)
        except AssertionError as exc:  # schemathesis' failures are AssertionErrors
            failures.append(f"{where} -> {response.status_code}: {str(exc)[:600]}")

    try:
        run()
    except Unsatisfiable:
        if mode is GenerationMode.POSITIVE:
            raise
        # Nothing in the operation can be made invalid (no parameters, no body).
    return sent


@pytest.mark.timeout(300)  # ~1 min here under load; a hang fails rather than stalls the suite
def test_no_input_breaks_the_api(fuzz_target):
    schema = schemathesis.openapi.from_url(f"{fuzz_target.base_url}/openapi.json")
    failures: list[str] = []
    operations = sent = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            sent += _fuzz(operation, mode, fuzz_target.keys, failures)
    assert operations > 30 and sent > operations * EXAMPLES, (operations, sent)
    assert not failures, f"{len(failures)} of {sent} requests failed:\n" + "\n".join(failures[:30])
