"""Submitting a generation: the prompt goes to the bounded-retention prompts topic, the
text-free request to the durable requests topic, which references it."""
from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from models import topics
from models.events import new_event
from models.events_generation import GenerationRequested, Position, PromptSubmitted, Sampling
from models.registry import Principal, Registry
from pipelines.eventlog import EventLog
from pipelines.routing import partition_of, publish
from pipelines.tokencount import TokenCounter


class SubmissionError(ValueError):
    def __init__(self, status: int, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


@dataclass(frozen=True)
class SubmitGeneration:
    request_id: str | None
    model_alias: str
    prompt: str
    max_output_tokens: int
    deadline_ms: int | None
    priority: str = "normal"
    sampling: Sampling = Sampling()
    route: str = "generations"


@dataclass(frozen=True)
class Submitted:
    request: GenerationRequested
    tenant_id: str
    stream_partition: int


def submit_generation(
    cmd: SubmitGeneration, *, principal: Principal, registry: Registry, log: EventLog, counter: TokenCounter,
    default_deadline_ms: int,
) -> Submitted:
    revision = registry.resolve_alias(cmd.model_alias, principal.tenant_id)
    if revision is None:
        raise SubmissionError(404, "model_not_found", f"The model '{cmd.model_alias}' does not exist", "model")
    input_tokens = counter.count(revision.model_path, cmd.prompt)
    if input_tokens + cmd.max_output_tokens > revision.max_model_len:
        raise SubmissionError(
            400 if input_tokens < revision.max_model_len else 413, "context_length_exceeded",
            f"{input_tokens} input tokens + {cmd.max_output_tokens} output tokens exceed this model's "
            f"context of {revision.max_model_len}", "max_output_tokens")
    request_id = cmd.request_id or "gen_" + uuid.uuid4().hex
    deadline_ms = cmd.deadline_ms if cmd.deadline_ms is not None else default_deadline_ms
    deadline_at = datetime.now(timezone.utc) + timedelta(milliseconds=deadline_ms)
    stream_partition = partition_of(log, topics.STREAM, request_id)
    stream_offset = log.end_offset(topics.STREAM.name, stream_partition)
    prompt_env = new_event(PromptSubmitted(request_id=request_id, prompt=cmd.prompt),
                           tenant_id=principal.tenant_id, correlation_id=request_id)
    [prompt_record] = publish(log, topics.PROMPTS, [prompt_env])
    request = GenerationRequested(
        request_id=request_id, application_id=principal.application_id, key_id=principal.key_id,
        model_alias=cmd.model_alias, model_revision=revision.model_revision, input_tokens=input_tokens,
        input_sha256=hashlib.sha256(cmd.prompt.encode()).hexdigest(), max_output_tokens=cmd.max_output_tokens,
        deadline_at=deadline_at, priority=cmd.priority, sampling=cmd.sampling,
        prompt_ref=Position(topic=prompt_record.topic, partition=prompt_record.partition, offset=prompt_record.offset),
        stream_offset=stream_offset, route=cmd.route,
    )
    publish(log, topics.REQUESTS, [new_event(request, tenant_id=principal.tenant_id, correlation_id=request_id,
                                             causation_id=str(prompt_env.event_id))])
    return Submitted(request=request, tenant_id=principal.tenant_id, stream_partition=stream_partition)
