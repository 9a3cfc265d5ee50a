"""Generations in the shapes of OpenAI's chat completions and completions APIs: whole
responses, stream chunks (with `stream_options.include_usage`) and errors mid-stream.

`system_fingerprint` carries the pinned model revision, which is what it means there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from api.sse import frame
from api.stream_hub import StreamEvent
from models.events_generation import (
    CacheHit, GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationStarted, TokensEmitted,
)

Kind = Literal["chat", "text"]


def usage_json(input_tokens: int, output_tokens: int, cached: bool | None = None) -> dict:
    usage = {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
             "total_tokens": input_tokens + output_tokens}
    return {**usage, "cached": True} if cached else usage  # answered from the semantic cache


def finish_reason(end) -> str:
    return end.finish_reason if isinstance(end, GenerationCompleted) else "cancelled"


@dataclass
class OpenAIShape:
    kind: Kind
    request_id: str
    model: str
    created: int
    include_usage: bool = False
    model_revision: str | None = None

    @property
    def _object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def _head(self, obj: str) -> dict:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.model_revision}

    def _choice(self, text: str | None, reason: str | None, *, role: bool = False) -> dict:
        if self.kind == "chat":
            delta = {} if text is None else {"content": text}
            if role:
                delta = {"role": "assistant", **delta}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}

    def _chunk(self, event: StreamEvent, choices: list, usage=None) -> bytes:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        body = {**self._head(obj), "choices": choices}
        if self.include_usage:
            body["usage"] = usage  # null on every chunk but the last, as OpenAI sends it
        return frame(body, event.offset)

    def chunks(self, event: StreamEvent) -> list[bytes]:
        """The stream chunks for one event (none for events a client has no use for)."""
        p = event.env.payload
        if isinstance(p, (GenerationStarted, CacheHit)):
            self.model_revision = p.model_revision
            if self.kind == "chat":
                return [self._chunk(event, [self._choice("", None, role=True)])]
            return []
        if isinstance(p, TokensEmitted):
            return [self._chunk(event, [self._choice(p.text, None)])] if p.text else []
        if isinstance(p, (GenerationCompleted, GenerationCancelled)):
            out = [self._chunk(event, [self._choice(None if self.kind == "chat" else "", finish_reason(p))])]
            if self.include_usage:
                out.append(self._chunk(event, [], usage_json(p.input_tokens, p.output_tokens,
                                                             getattr(p, "cached", None))))
            return out
        if isinstance(p, GenerationFailed):
            return [frame({"error": {"message": "The generation failed", "type": "server_error", "param": None,
                                     "code": p.error_code}}, event.offset)]
        return []

    def timeout_chunk(self) -> bytes:
        return frame({"error": {"message": "The generation did not finish before its deadline",
                                "type": "timeout_error", "param": None, "code": "timeout"}})

    def response(self, text: str, end) -> dict:
        """The whole (non-streamed) response, from the text and the end event."""
        if isinstance(end, GenerationCompleted):
            self.model_revision = end.model_revision
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason(end)}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(end)}
        return {**self._head(self._object), "choices": [choice],
                "usage": usage_json(end.input_tokens, end.output_tokens, getattr(end, "cached", None))}
