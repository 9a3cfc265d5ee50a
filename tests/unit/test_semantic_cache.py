"""The semantic cache: an exact partition first (tenant, revision, context, sampling), then
the nearest prompt within it above a threshold the tenant may raise but not lower; TTL,
invalidation epochs, a tenant's purge and a bound per tenant."""
from __future__ import annotations

import random

import numpy as np
import pytest

from pipelines.cache import semantic as sc
from pipelines.cache.semantic import HashingEmbedder, SemanticCache, cacheable, partition_key

SYSTEM = {"system": "You are terse.", "tools": None, "response_format": None, "turns": []}
GREEDY = {"temperature": 0.0, "max_output_tokens": 64}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def cache(**kw) -> SemanticCache:
    return SemanticCache(HashingEmbedder(), **kw)


def put(c, tenant="acme", prompt="what is the capital of france", partition=None, ttl_s=60.0, epoch=0, alias="chat"):
    partition = partition or partition_key(tenant, "rev@1", context=SYSTEM, sampling=GREEDY)
    return c.insert(tenant_id=tenant, alias=alias, partition=partition, prompt=prompt, answer="Paris.",
                    output_tokens=2, input_tokens=7, finish_reason="stop", ttl_s=ttl_s, epoch=epoch)


def test_only_greedy_sampling_is_cacheable_unless_the_tenant_opts_in_and_an_omitted_temperature_is_1():
    assert cacheable({"temperature": 0}) and not cacheable({}) and not cacheable({"temperature": 0.7})
    assert cacheable({"temperature": 0.7}, sampled_too=True)
    assert partition_key("a", "r", context=SYSTEM, sampling={}) == \
        partition_key("a", "r", context=SYSTEM, sampling={"temperature": 1.0, "top_p": 1.0})


def test_no_hit_crosses_a_tenant_a_revision_a_context_or_sampling_over_ten_thousand_probes():
    c = cache()
    prompt = "what is the capital of france"
    entry = put(c, prompt=prompt)
    own = partition_key("acme", "rev@1", context=SYSTEM, sampling=GREEDY)
    assert c.lookup(partition=own, prompt=prompt).entry == entry
    rng = random.Random(7)
    words = prompt.split()
    hits = 0
    for i in range(10_000):
        tenant, revision, context, sampling = "acme", "rev@1", dict(SYSTEM), dict(GREEDY)
        kind = i % 4
        if kind == 0:
            tenant = rng.choice(["acme2", "acm", "Acme", "other", "acme "]) + str(i % 7)
        elif kind == 1:
            revision = rng.choice(["rev@2", "rev@1 ", "REV@1"])
        elif kind == 2:
            context["system"] = rng.choice(["You are verbose.", "You are terse", "", "you are terse."])
            context["turns"] = [] if i % 8 else [{"role": "user", "content": "hi"}]
        else:
            sampling = rng.choice([{"temperature": 0.0, "max_output_tokens": 65}, {"temperature": 1e-9},
                                   {"temperature": 0.0, "max_output_tokens": 64, "seed": 1},
                                   {"temperature": 0.0, "max_output_tokens": 64, "top_p": 0.9}])
        probe = " ".join(rng.sample(words, len(words))) if i % 2 else prompt  # the same words, any order
        partition = partition_key(tenant, revision, context=context, sampling=sampling)
        assert partition != own
        hits += c.lookup(partition=partition, prompt=probe).entry is not None
    assert hits == 0


def test_a_paraphrase_above_the_threshold_hits_one_below_misses_and_a_tenant_raises_but_never_lowers_it():
    c = cache(floor=0.8)
    put(c, prompt="what is the capital of france")
    part = partition_key("acme", "rev@1", context=SYSTEM, sampling=GREEDY)
    same_words = c.lookup(partition=part, prompt="France: what is the capital of it?")
    assert same_words.entry is not None and same_words.similarity >= 0.8
    # five of six words shared: cosine 5/sqrt(6*6) ~ 0.83 with the hashing embedder
    near = c.lookup(partition=part, prompt="what is the capital of spain")
    assert near.entry is not None and 0.8 <= near.similarity < 0.9
    assert c.lookup(partition=part, prompt="what is the capital of spain", tenant_threshold=0.9).entry is None
    lowered = c.lookup(partition=part, prompt="capital city of spain", tenant_threshold=0.1)
    assert lowered.threshold == 0.8 and lowered.entry is None and lowered.similarity < 0.8, "the floor holds"


def test_entries_expire_an_invalidation_epoch_kills_older_ones_and_a_purge_deletes_a_tenant_s():
    clock = Clock()
    c = cache(clock=clock)
    part = partition_key("acme", "rev@1", context=SYSTEM, sampling=GREEDY)
    put(c, ttl_s=10)
    assert c.lookup(partition=part, prompt="what is the capital of france").entry is not None
    clock.now += 10
    assert c.lookup(partition=part, prompt="what is the capital of france").entry is None, "expired"
    assert c.expire() == 1 and c.size() == 0

    put(c, epoch=3)
    assert c.lookup(partition=part, prompt="what is the capital of france", epoch=3).entry is not None
    assert c.lookup(partition=part, prompt="what is the capital of france", epoch=4).entry is None, "invalidated"
    put(c, tenant="globex", partition=partition_key("globex", "rev@1", context=SYSTEM, sampling=GREEDY))
    put(c, alias="other")
    assert c.purge_tenant("acme", alias="other") == 1 and c.size("acme") == 1
    assert c.purge_tenant("acme") == 1 and c.size("acme") == 0 and c.size("globex") == 1


def test_a_tenant_s_entries_are_bounded_oldest_first_and_large_partitions_stay_searchable():
    c = cache(max_entries_per_tenant=3)
    part = partition_key("acme", "rev@1", context=SYSTEM, sampling=GREEDY)
    for i in range(5):
        put(c, prompt=f"question number {i} about rivers")
    assert c.size("acme") == 3
    assert c.lookup(partition=part, prompt="question number 0 about rivers", tenant_threshold=0.99).entry is None
    assert c.lookup(partition=part, prompt="question number 4 about rivers", tenant_threshold=0.99).entry is not None

    big = SemanticCache(HashingEmbedder(dim=32))
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(sc.FLAT_LIMIT + 500, 32)).astype("float32")
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    entries = [big.insert(tenant_id="acme", alias="chat", partition="p", prompt=str(i), answer="a", output_tokens=1,
                          input_tokens=1, finish_reason="stop", ttl_s=60, vector=v) for i, v in enumerate(vectors)]
    for i in (0, sc.FLAT_LIMIT, len(vectors) - 1):
        found = big.lookup(partition="p", prompt=str(i), vector=vectors[i])
        assert found.entry == entries[i] and found.similarity == pytest.approx(1.0, abs=1e-5)


def test_no_entry_outlives_the_answers_text_on_the_log():
    from models.registry import CachePolicy

    class Registry:
        def __init__(self, ttl_s):
            self.policy = CachePolicy(enabled=True, ttl_s=ttl_s)

        def cache_policy(self, tenant_id, alias):
            return self.policy

        def cache_epoch(self, tenant_id, alias):
            return 0
    cache = sc.AnswerCache(HashingEmbedder)

    def ttl(policy_ttl_s):
        return cache.query(Registry(policy_ttl_s), tenant_id="acme", alias="chat", revision="m@1", text="hi",
                           context={"kind": "text"}, sampling={"temperature": 0}).ttl_s
    assert ttl(600) == 600
    assert ttl(30 * 24 * 3600) == sc.MAX_TTL_S == 24 * 3600, "the stream topic keeps text a day"


def test_a_format_the_answer_is_held_to_is_a_partition_of_its_own():
    schema = {"kind": "json_schema", "json_schema": '{"type":"object"}'}
    free = partition_key("acme", "rev@1", context=SYSTEM, sampling=GREEDY)
    held = partition_key("acme", "rev@1", context=SYSTEM, sampling={**GREEDY, "structured_output": schema})
    other = partition_key("acme", "rev@1", context=SYSTEM,
                          sampling={**GREEDY, "structured_output": {**schema, "json_schema": '{"type":"array"}'}})
    assert len({free, held, other}) == 3
    assert partition_key("acme", "rev@1", context=SYSTEM, sampling={**GREEDY, "structured_output": None}) == free
