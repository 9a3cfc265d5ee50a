"""`/metrics` after real traffic: latency histograms per pool, revision and prompt class, decisions by reason,
tokens and in-flight per tenant; and no prompt or completion text anywhere in metrics
or in the log lines the platform wrote meanwhile."""
from __future__ import annotations

import logging
import uuid

from prometheus_client.parser import text_string_to_metric_families

from pipelines.admin import commands as admin
from tests.harness import MODEL_ALIAS


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_describe_traffic_and_never_carry_text(platform, caplog):
    caplog.set_level(logging.DEBUG)
    tenant_id, secret = platform.tenant()
    secret_words = f"confidential-{uuid.uuid4().hex}"
    with platform.client(secret) as client:
        for stream in (False, True):
            response = client.post("/v1/chat/completions", json={
                "model": MODEL_ALIAS, "messages": [{"role": "user", "content": secret_words}], "max_tokens": 6,
                "stream": stream, "ignore_eos": True})
            assert response.status_code == 200
            response.read()
        admin.set_limits(platform.view, tenant_id=tenant_id, actor="tests", requests_per_minute=1)
        assert client.post("/v1/completions", json={"model": MODEL_ALIAS, "prompt": secret_words}).status_code == 429
        text = client.get("/metrics").text

    found = samples(text)
    # A few words of chat: a short prompt, at the revision the alias names.
    pool = frozenset({("pool", "interactive-normal"), ("revision", platform.model_revision), ("prompt_class", "short")})
    for name in ("ledgerlm_ttft_seconds_count", "ledgerlm_e2e_seconds_count"):
        assert found[(name, pool)] >= 2, name
    assert found[("ledgerlm_queue_seconds_count", frozenset({("pool", "interactive-normal")}))] >= 2
    # One gap per token after the first, however the tokens were grouped into events.
    assert found[("ledgerlm_inter_token_seconds_count", pool)] >= 2 * 5
    assert found[("ledgerlm_admission_decisions_total", frozenset({("decision", "admitted"), ("reason", "")}))] >= 2
    assert found[("ledgerlm_admission_decisions_total", frozenset({("decision", "rejected"), ("reason", "rate")}))] >= 1
    assert found[("ledgerlm_tokens_total", frozenset({("tenant", tenant_id), ("kind", "output")}))] == 12
    assert found[("ledgerlm_in_flight_requests", frozenset({("tenant", tenant_id)}))] == 0

    assert secret_words not in text
    # kafka-python's own DEBUG lines dump the bytes it sends (prompts included): run its
    # loggers at INFO or above in production. Everything else, at every level, has no text.
    leaked = [r for r in caplog.records if secret_words in r.getMessage()
              and (r.levelno >= logging.INFO or not r.name.startswith("kafka."))]
    assert not leaked, [(r.name, r.levelname) for r in leaked]
