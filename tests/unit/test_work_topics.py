"""A revision's work spreads by request over enough partitions for a pool of many workers;
a worker's mark of an item lands beside the item whatever the key says."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from models import topics
from models.events import caused_by, decode, new_event
from models.events_generation import GenerationQueued, GenerationRequested, GenerationStarted, Position
from pipelines.eventlog import partition_for
from pipelines.publish import beside, key_for, to_message

REV = "tiny@1"


def queued(tenant_id: str, request_id: str):
    req = GenerationRequested(request_id=request_id, model_alias="tiny", model_revision=REV, input_tokens=1,
                              input_sha256="0" * 64, max_output_tokens=1,
                              prompt_ref=Position(topic=topics.PROMPTS.name, partition=0, offset=0))
    return new_event(GenerationQueued(request=req, reservation_id="res", queued_at=datetime.now(timezone.utc)),
                     tenant_id=tenant_id, correlation_id=request_id)


@pytest.mark.parametrize("pool", [None, topics.SHARED_POOL, "gold"])
@pytest.mark.parametrize("priority", ["high", "normal"])
def test_a_revisions_work_topic_is_keyed_by_request_with_room_for_32_workers(pool, priority):
    topic = topics.work_topic(pool, priority, REV)
    assert topic.keyed_by == "request"
    assert topic.partitions >= 32 and topic.partitions == topics.WORK_PARTITIONS
    env = queued("acme", "gen_1")
    assert key_for(topic, env) == "gen_1"


def test_one_tenants_work_spreads_over_the_partitions():
    topic = topics.work_topic(None, "normal", REV)
    placed = {partition_for(key_for(topic, queued("acme", f"gen_{i}")), topic.partitions) for i in range(400)}
    assert len(placed) == topic.partitions


def test_the_revision_less_topics_stay_keyed_by_tenant():
    for topic in (topics.WORK_HIGH, topics.WORK_NORMAL, topics.work_topic("gold", "normal")):
        assert (topic.keyed_by, topic.partitions) == ("tenant", 4)


def test_a_mark_goes_to_the_items_partition_whatever_its_key_says():
    topic = topics.work_topic(None, "normal", REV)
    item = queued("acme", "gen_1")
    started = caused_by(item, GenerationStarted(request_id="gen_1", worker_id="w", model_revision=REV, queued_ms=0))
    own = partition_for("gen_1", topic.partitions)
    assert to_message(topic, started).key == to_message(topic, item).key == "gen_1"
    # An item written under another keying (an older log) keeps its mark beside it.
    elsewhere = (own + 1) % topic.partitions
    name, message = beside(topic, started, elsewhere)
    assert (name, message.partition) == (topic.name, elsewhere)
    assert decode(message.value).payload.request_id == "gen_1"
