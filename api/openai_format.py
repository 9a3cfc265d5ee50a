"""Generations in the shapes of OpenAI's chat completions and completions APIs: whole
responses, stream chunks (with `stream_options.include_usage`) and errors mid-stream.

`system_fingerprint` carries the pinned model revision, which is what it means there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from api.sse import frame
from api.stream_hub import StreamEvent
from models.events_generation import (
    CacheHit, GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationStarted, TokenLogprob,
    TokensEmitted,
)

Kind = Literal["chat", "text"]


def usage_json(input_tokens: int, output_tokens: int, cached: bool | None = None) -> dict:
    usage = {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
             "total_tokens": input_tokens + output_tokens}
    return {**usage, "cached": True} if cached else usage  # answered from the semantic cache


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def chat_logprobs(tokens: list[TokenLogprob]) -> dict:
    """`choices[].logprobs` of a chat completion (or of one chunk)."""
    return {"content": [{**_entry(t.token, t.logprob), "top_logprobs": [_entry(a.token, a.logprob) for a in t.top]}
                        for t in tokens], "refusal": None}


def text_logprobs(tokens: list[TokenLogprob], offset: int = 0) -> dict:
    """`choices[].logprobs` of a completion (or of one chunk whose text starts at `offset`)."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [{a.token: a.logprob for a in t.top} for t in tokens], "text_offset": offsets}


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
    logprobs: bool = False  # the request asked for them
    _text_offset: int = field(default=0, init=False)  # of the next chunk's text, for `text_offset`

    def _logprobs(self, tokens: list[TokenLogprob] | None, offset: int = 0) -> dict | None:
        if not self.logprobs:
            return None
        tokens = list(tokens or ())
        return chat_logprobs(tokens) if self.kind == "chat" else text_logprobs(tokens, offset)

    @property
    def _object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def _head(self, obj: str) -> dict:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.model_revision}

    def _choice(self, text: str | None, reason: str | None, *, role: bool = False,
                logprobs: dict | None = None) -> dict:
        if self.kind == "chat":
            delta = {} if text is None else {"content": text}
            if role:
                delta = {"role": "assistant", **delta}
            return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        return {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": reason}

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
            if not p.text:
                return []
            logprobs = self._logprobs(p.logprobs, self._text_offset)
            self._text_offset += len(p.text)
            return [self._chunk(event, [self._choice(p.text, None, logprobs=logprobs)])]
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

    def response(self, text: str, end, logprobs: list[TokenLogprob] | None = None) -> dict:
        """The whole (non-streamed) response, from the text, the end event and, for a request
        that asked for them, its tokens' log probabilities."""
        if isinstance(end, GenerationCompleted):
            self.model_revision = end.model_revision
        lp = self._logprobs(logprobs)
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                      "finish_reason": finish_reason(end)}
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish_reason(end)}
        return {**self._head(self._object), "choices": [choice],
                "usage": usage_json(end.input_tokens, end.output_tokens, getattr(end, "cached", None))}
