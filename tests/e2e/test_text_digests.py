"""Prompt and output digests on the durable topics are HMACs keyed per tenant: a short
prompt's plain SHA-256 is not on the log, and two tenants' equal prompts digest apart."""
from __future__ import annotations

import hashlib

from models import topics
from models.digests import TenantDigests
from tests.e2e.test_cancel import events_of
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until


def test_durable_digests_are_keyed_per_tenant(platform):
    digests = TenantDigests.from_settings(platform.settings)
    seen = {}
    for _ in range(2):
        tenant_id, secret = platform.tenant()
        with platform.client(secret) as client:
            done = client.post("/v1/generations", json={"model_alias": MODEL_ALIAS, "input": "yes",
                                                        "max_output_tokens": 4, "stream": False})
            assert done.status_code == 200, done.text
        request_id, text = done.json()["request_id"], done.json()["output"]
        [requested] = events_of(platform.admin_log, tenant_id, request_id, topics.REQUESTS, "GenerationRequested")
        [completed] = wait_until(lambda: events_of(platform.admin_log, tenant_id, request_id, topics.OUTCOMES,
                                                   "GenerationCompleted"), 30, every_s=0.2, what="the completion")
        assert requested.payload.input_sha256 == digests.hexdigest(tenant_id, "yes")
        assert requested.payload.input_sha256 != hashlib.sha256(b"yes").hexdigest()
        assert completed.payload.output_sha256 == digests.hexdigest(tenant_id, text)
        assert completed.payload.output_sha256 != hashlib.sha256(text.encode()).hexdigest()
        seen[tenant_id] = requested.payload.input_sha256
    assert len(set(seen.values())) == 2, "the same prompt of two tenants digests apart"
