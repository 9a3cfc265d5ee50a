"""The semantic cache over HTTP, both logs, with the real MiniLM embedder: a tenant whose
policy turns it on is answered from its own earlier answers (an identical prompt, or a
paraphrase above the threshold), in the same shapes as a generation with `cached: true`,
at its cache price and with no engine run; nothing crosses to another tenant, another
system prompt or other sampling; a raised threshold and an invalidation make it miss."""
from __future__ import annotations

from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until

QUESTION = "What is the capital city of France?"
PARAPHRASE = "What is France's capital city?"  # MiniLM: 0.99 against QUESTION
OTHER = "What is the capital city of Germany?"  # MiniLM: 0.67


def chat(client, text: str, *, system: str | None = None, **extra):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    r = client.post("/v1/chat/completions", json={"model": MODEL_ALIAS, "messages": messages, "max_tokens": 4,
                                                  "temperature": 0, "ignore_eos": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def cached(body: dict) -> bool:
    return bool(body["usage"].get("cached"))


def status(client, request_id: str, *, settled: bool = True) -> dict:
    def read():
        s = client.get(f"/v1/generations/{request_id}").json()
        return s if s["usage"]["settled"] or not settled else None
    return wait_until(read, 30, what=f"{request_id} settled")


def test_a_tenant_is_answered_from_its_own_cache_only_in_the_same_partition(platform):
    _, operator = platform.tenant(scopes=("admin",))
    a_id, a_secret = platform.tenant()
    b_id, b_secret = platform.tenant()
    with platform.client(operator) as ops, platform.client(a_secret) as a, platform.client(b_secret) as b:
        assert ops.put(f"/v1/admin/tenants/{a_id}/cache/{MODEL_ALIAS}", json={"threshold": 0.5}).status_code == 400, \
            "a threshold below the platform's floor is refused"
        for tenant in (a_id, b_id):
            r = ops.put(f"/v1/admin/tenants/{tenant}/cache/{MODEL_ALIAS}", json={"enabled": True})
            assert r.status_code == 200 and r.json()["enabled"], r.text

        first = chat(a, QUESTION)
        assert not cached(first)
        again = chat(a, QUESTION)
        assert cached(again) and again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        assert again["usage"]["completion_tokens"] == first["usage"]["completion_tokens"]
        assert cached(chat(a, PARAPHRASE)), "a paraphrase above the threshold hits"
        assert not cached(chat(a, OTHER)), "another question misses"

        ran, hit = status(a, first["id"]), status(a, again["id"])
        assert ran["usage"]["cost_micros"] > 0 and not ran["cached"]
        assert hit["cached"] and hit["status"] == "completed" and hit["usage"]["cost_micros"] == 0, hit
        assert hit["started_at"] is not None and hit["timings"]["queued_ms"] == 0

        # Isolation: the same words from another tenant, under another system prompt or
        # other sampling, are answered by the engine.
        b_first = chat(b, PARAPHRASE)
        assert not cached(b_first), "tenant A's cached answers to the same words are not B's"
        b_again = chat(b, QUESTION)
        assert cached(b_again) and status(b, b_again["id"])["cached"], "B's own paraphrase is"
        assert not cached(chat(a, QUESTION, system="Answer in French."))
        assert not cached(chat(a, QUESTION, temperature=0.7)) and not cached(chat(a, QUESTION, temperature=0.7)), \
            "a sampled answer is not cached without the tenant's opt-in"
        assert not cached(chat(a, QUESTION, max_tokens=3)), "a different output limit is another partition"

        # The native route streams a hit like a generation: started, tokens, completed.
        def streamed() -> list[str]:
            with a.stream("POST", "/v1/generations", json={"model_alias": MODEL_ALIAS, "input": QUESTION,
                                                           "max_output_tokens": 4, "temperature": 0,
                                                           "ignore_eos": True}) as r:
                assert r.status_code == 200
                return [line for line in r.iter_lines() if line.startswith("data: {")]
        ran_frames, hit_frames = streamed(), streamed()  # a text prompt: not the chat's partition
        assert '"cached":true' not in "".join(ran_frames)
        assert [f.split('"type":"')[1].split('"')[0] for f in hit_frames] == ["started", "tokens", "completed"]
        assert '"cached":true' in hit_frames[0] and '"cached":true' in hit_frames[-1]

        # A raised threshold misses the paraphrase; the price set by an operator is charged.
        r = ops.put(f"/v1/admin/tenants/{a_id}/cache/{MODEL_ALIAS}",
                    json={"threshold": 0.995, "price_output_per_1k_micros": 1000})
        assert r.status_code == 200 and r.json()["threshold"] == 0.995
        assert not cached(chat(a, PARAPHRASE))
        priced = chat(a, QUESTION)
        assert cached(priced) and status(a, priced["id"])["usage"]["cost_micros"] == 4, "4 tokens at 1000 a thousand"

        shown = ops.get(f"/v1/admin/tenants/{a_id}/cache").json()
        assert shown["data"][0]["this_api"]["hits"] >= 3 and shown["data"][0]["this_api"]["misses"] >= 4, shown
        metrics = ops.get("/metrics").text
        assert f'ledgerlm_cache_lookups_total{{alias="{MODEL_ALIAS}",outcome="hit",tenant="{a_id}"}}' in metrics

        # An invalidation kills what was cached; what is asked next fills it again.
        assert ops.post(f"/v1/admin/tenants/{a_id}/cache/invalidate", json={"model_alias": MODEL_ALIAS}
                        ).status_code == 200
        assert not cached(chat(a, QUESTION)) and cached(chat(a, QUESTION))
        assert ops.put(f"/v1/admin/tenants/{a_id}/cache/{MODEL_ALIAS}", json={"enabled": False}).status_code == 200
        assert not cached(chat(a, QUESTION)), "off again"


def test_a_tenant_admin_turns_its_own_cache_on_but_only_an_operator_sets_its_price(platform):
    own_id, tenant_admin = platform.tenant(scopes=("tenant_admin",))
    with platform.client(tenant_admin) as ta:
        priced = ta.put(f"/v1/admin/tenants/{own_id}/cache/{MODEL_ALIAS}", json={"price_output_per_1k_micros": 0})
        assert priced.status_code == 403 and priced.json()["error"]["code"] == "beyond_grant", priced.text
        assert ta.put(f"/v1/admin/tenants/{own_id}/cache/no-such-alias", json={}).status_code == 404
        on = ta.put(f"/v1/admin/tenants/{own_id}/cache/{MODEL_ALIAS}", json={"threshold": 0.97, "ttl_s": 60})
        assert on.status_code == 200, on.text
        [shown] = ta.get(f"/v1/admin/tenants/{own_id}/cache").json()["data"]
        assert shown["enabled"] and shown["threshold"] == 0.97 and shown["ttl_s"] == 60
        assert shown["price_output_per_1k_micros"] == 0 and shown["invalidations"] == 0
