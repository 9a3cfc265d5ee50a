"""An OpenAI-compatible endpoint of known speed, for testing `ledgerlm loadtest`: each
request waits for one of `slots` (so it saturates at that concurrency), sends its first
token `ttft_s` after it got a slot and the next ones `itl_s` apart, and refuses the keys in
`reject` with 429 and their error code as the platform does. Chat streams begin with a
role-only chunk at once, as the platform's do, so a client that took it for the first
token would report a TTFT of about zero."""
from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.helpers import Launched, wait_until


@dataclass
class FakeOpenAI:
    ttft_s: float = 0.05
    itl_s: float = 0.01
    slots: int = 64
    reject: dict[str, str] = field(default_factory=dict)  # API key -> error.code of a 429
    tokens_per_chunk: int = 1
    received: list[tuple[float, str]] = field(default_factory=list)  # (perf_counter, key) per request
    _slots: asyncio.Semaphore | None = None

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                 Route("/v1/completions", self._text, methods=["POST"])])

    async def _chat(self, request: Request):
        return await self._answer(request, "chat")

    async def _text(self, request: Request):
        return await self._answer(request, "text")

    async def _answer(self, request: Request, kind: str):
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        self.received.append((time.perf_counter(), key))
        if key in self.reject:
            return JSONResponse({"error": {"message": "refused", "type": "rate_limit_error", "param": None,
                                           "code": self.reject[key]}}, status_code=429,
                                headers={"Retry-After": "1"})
        body = await request.json()
        n = int(body.get("max_tokens") or 16)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.slots)
        if not body.get("stream"):
            async with self._slots:
                await asyncio.sleep(self.ttft_s + self.itl_s * (n - 1))
            choice = ({"message": {"role": "assistant", "content": "x" * n}} if kind == "chat" else {"text": "x" * n})
            return JSONResponse({"choices": [{"index": 0, "finish_reason": "length", **choice}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}})
        return StreamingResponse(self._stream(kind, n, bool((body.get("stream_options") or {}).get("include_usage"))),
                                 media_type="text/event-stream")

    async def _stream(self, kind: str, n: int, usage: bool):
        def frame(obj: dict) -> bytes:
            return f"data: {json.dumps(obj)}\n\n".encode()

        def chunk(text: str | None, role: bool = False) -> bytes:
            if kind == "chat":
                delta = {"role": "assistant", "content": ""} if role else {"content": text}
                return frame({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            return frame({"choices": [{"index": 0, "text": text, "finish_reason": None}]})

        if kind == "chat":
            yield chunk(None, role=True)
        async with self._slots:
            # Each token at its own time from the start, so sleeps do not add up their lateness.
            start = time.perf_counter() + self.ttft_s
            sent = 0
            while sent < n:
                batch = min(self.tokens_per_chunk, n - sent)
                due = start + self.itl_s * (sent + batch - 1)
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                yield chunk("x" * batch)
                sent += batch
        yield frame({"choices": [{"index": 0, "delta": {}, "text": "", "finish_reason": "length"}]})
        if usage:
            yield frame({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n,
                                                  "total_tokens": n + 1}})
        yield b"data: [DONE]\n\n"


@contextmanager
def serve(fake: FakeOpenAI):
    """`fake` served by uvicorn on a loopback port in a process of its own (so the test
    process's threads take no time from its pacing); yields its base URL. On leaving, the
    requests it received are copied into `fake.received`."""
    config = {"ttft_s": fake.ttft_s, "itl_s": fake.itl_s, "slots": fake.slots, "reject": fake.reject,
              "tokens_per_chunk": fake.tokens_per_chunk}
    with Launched([sys.executable, "-m", "tests.fake_openai", json.dumps(config)], ready=READY, ready_s=60) as server:
        url = server.ready_line.split(READY, 1)[1].strip()
        try:
            yield url
        finally:
            with urllib.request.urlopen(f"{url}/_received", timeout=15) as answer:
                fake.received[:] = [tuple(r) for r in json.load(answer)]


READY = "fake openai serving on "


def main(argv: list[str]) -> None:
    fake = FakeOpenAI(**json.loads(argv[0]))
    app = fake.app()
    app.add_route("/_received", lambda _request: JSONResponse(fake.received), methods=["GET"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="fake-openai")
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 30, what="the fake OpenAI server to start")
    if server.started:  # said once the socket listens: the first request never meets a refused connection
        print(f"{READY}http://127.0.0.1:{port}", flush=True)
    thread.join()


if __name__ == "__main__":
    main(sys.argv[1:])
