"""The `InferenceEngine` contract's frame: what every engine a worker runs on promises
through the port (`workers.engine`), and how a test drives one from its own thread.

An `EngineCase` is an engine on the loop of an `EngineRunner`, with what sets it apart from
the rest: a stand-in may make one token whatever is asked (`runs_long` False), or hold every
stream until it is aborted (`ends_alone` False). A test still runs against every case; these
only say which way its request ends. Waits are conditions with deadlines.
"""
from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from tests.helpers import wait_until
from workers.engine import EngineDelta, EngineRequest, InferenceEngine, KvFigures
from workers.engine_runner import EngineRunner
from workers.engine_stats import EngineStats

DEADLINE_S = 60.0
PROMPT = "The clerk keeps the books, and the auditor reads them."
SHORT_TOKENS = 4
LONG_TOKENS = 400  # within the tiny engine's 512-token context, with the prompt
REASONS = {"stop", "length", "abort"}


def request(max_output_tokens: int, prompt: str = PROMPT) -> EngineRequest:
    return EngineRequest(request_id=f"contract-{uuid.uuid4().hex[:12]}", prompt=prompt,
                         max_output_tokens=max_output_tokens, tenant_id="tenant-contract", ignore_eos=True)


class Generation:
    """One request streaming on the engine's loop; its deltas gathered as they come."""

    def __init__(self, runner: EngineRunner, engine: InferenceEngine, req: EngineRequest):
        self.request = req
        self.deltas: list[EngineDelta] = []
        self.done: concurrent.futures.Future[None] = runner.submit_nowait(self._pump(engine))

    async def _pump(self, engine: InferenceEngine) -> None:
        async with aclosing(engine.generate(self.request)) as stream:
            async for delta in stream:
                self.deltas.append(delta)

    def ended(self, timeout_s: float = DEADLINE_S) -> list[EngineDelta]:
        """Its deltas once the stream ended; fails the test past `timeout_s`."""
        try:
            self.done.result(timeout_s)
        except concurrent.futures.TimeoutError:
            raise AssertionError(f"{self.request.request_id} still streaming after {timeout_s:g} s "
                                 f"({len(self.deltas)} deltas)") from None
        return list(self.deltas)


@dataclass
class EngineCase:
    runner: EngineRunner
    engine: InferenceEngine
    ends_alone: bool = True  # a request ends by itself (False: its stream waits for an abort)
    runs_long: bool = True  # a long request is still running a while (False: one token, whatever is asked)
    # Whether the engine has taken the generation's request on (default: a delta of it came).
    started: Callable[[Generation], bool] = field(default=lambda generation: bool(generation.deltas))

    def submit(self, coro, timeout_s: float = DEADLINE_S):
        return self.runner.submit(coro, timeout=timeout_s)

    def generate(self, max_output_tokens: int) -> Generation:
        return Generation(self.runner, self.engine, request(max_output_tokens))

    def abort_until_ended(self, generation: Generation) -> list[EngineDelta]:
        """Aborts `generation` (again, while the engine may not have taken it on yet: an
        unknown id is ignored) until its stream ends."""
        rid = generation.request.request_id

        def aborted() -> bool:
            self.submit(self.engine.abort(rid))
            return generation.done.done()

        wait_until(aborted, DEADLINE_S, what=f"an abort to end {rid}", every_s=0.05)
        return generation.ended()

    def close_twice(self) -> None:
        """Closes the engine on its loop twice, then its runner (a third close), then once
        more from this thread with its loop gone."""
        self.submit(_close(self.engine))
        self.submit(_close(self.engine))
        self.runner.close()
        self.engine.close()


def assert_one_stream(deltas: list[EngineDelta], req: EngineRequest) -> EngineDelta:
    """The deltas of one request: its own, one finished delta and that one last, with a
    reason only there, and running totals that add up. Returns the last."""
    assert deltas, f"{req.request_id} ended without a delta"
    assert {d.request_id for d in deltas} == {req.request_id}
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert deltas[-1].finish_reason in REASONS
    total = 0
    for delta in deltas:
        assert delta.new_tokens >= 0
        total += delta.new_tokens
        assert delta.output_tokens == total, f"a running total of {delta.output_tokens} after {total} tokens"
        assert delta.prompt_tokens is None or delta.prompt_tokens > 0
    assert deltas[-1].output_tokens <= req.max_output_tokens
    return deltas[-1]


def assert_consistent(kv: KvFigures) -> None:
    """What any engine's KV figures keep to: zeros from one that keeps none, and otherwise
    no more used than allocated, in whole blocks where it says their size."""
    assert isinstance(kv, KvFigures)
    fields = (kv.capacity_tokens, kv.used_tokens, kv.preemptions, kv.prefix_cache_queries,
              kv.prefix_cache_hits, kv.block_tokens, kv.reserved_tokens)
    assert all(isinstance(n, int) and n >= 0 for n in fields), kv
    assert 0.0 <= kv.usage <= 1.0, kv
    assert kv.prefix_cache_hits <= kv.prefix_cache_queries, kv
    assert kv.used_tokens + kv.reserved_tokens <= kv.capacity_tokens or kv == KvFigures(
        prefix_cache_queries=kv.prefix_cache_queries, prefix_cache_hits=kv.prefix_cache_hits), kv
    if kv.block_tokens:
        assert kv.capacity_tokens % kv.block_tokens == 0 and kv.used_tokens % kv.block_tokens == 0, kv


async def _close(engine: InferenceEngine) -> None:
    engine.close()


class EngineContract:
    """Subclasses give the `case` fixture: an `EngineCase` on a started engine."""

    def test_a_request_streams_deltas_to_one_finished_delta_last(self, case: EngineCase):
        generation = case.generate(SHORT_TOKENS)
        if case.ends_alone:
            last = assert_one_stream(generation.ended(), generation.request)
            assert last.finish_reason in {"stop", "length"}
            assert last.output_tokens >= 1
        else:  # a stream held until aborted ends the same way
            wait_until(lambda: case.started(generation), DEADLINE_S, what="the engine to take the request on")
            last = assert_one_stream(case.abort_until_ended(generation), generation.request)
            assert last.finish_reason == "abort"

    def test_an_abort_ends_a_running_request(self, case: EngineCase):
        generation = case.generate(LONG_TOKENS)
        wait_until(lambda: case.started(generation), DEADLINE_S, what="the engine to take the request on")
        last = assert_one_stream(case.abort_until_ended(generation), generation.request)
        if case.runs_long:
            assert (last.finish_reason, last.output_tokens < LONG_TOKENS) == ("abort", True)
        else:  # it ended before the abort, which was then ignored
            assert last.finish_reason in {"stop", "length"}
        assert case.submit(case.engine.health()) is True

    def test_an_abort_of_an_unknown_request_is_ignored(self, case: EngineCase):
        case.submit(case.engine.abort(f"never-submitted-{uuid.uuid4().hex[:8]}"))
        assert case.submit(case.engine.health()) is True
        if case.ends_alone:  # it still serves
            generation = case.generate(SHORT_TOKENS)
            assert assert_one_stream(generation.ended(), generation.request).finish_reason in {"stop", "length"}

    def test_a_serving_engine_is_healthy_and_not_errored(self, case: EngineCase):
        assert case.submit(case.engine.health()) is True
        assert case.engine.errored() is False

    def test_it_counts_the_tokens_of_text_from_any_thread(self, case: EngineCase):
        short, longer = case.engine.count_tokens("Hi there"), case.engine.count_tokens(PROMPT * 3)
        assert isinstance(short, int) and isinstance(longer, int)
        assert 0 < short < longer

    def test_its_config_hash_is_a_stable_string(self, case: EngineCase):
        first = case.engine.engine_config_hash()
        assert isinstance(first, str) and first.strip() == first and first
        assert case.engine.engine_config_hash() == first

    def test_its_kv_figures_are_consistent_idle_and_busy(self, case: EngineCase):
        assert_consistent(case.engine.kv_figures())
        generation = case.generate(LONG_TOKENS)
        wait_until(lambda: case.started(generation), DEADLINE_S, what="the engine to take the request on")
        assert_consistent(case.engine.kv_figures())
        case.abort_until_ended(generation)
        assert_consistent(case.engine.kv_figures())

    def test_its_capacity_and_limits_are_positive(self, case: EngineCase):
        seqs, context = case.engine.max_num_seqs(), case.engine.max_model_len()
        assert isinstance(seqs, int) and seqs >= 1
        assert context is None or (isinstance(context, int) and context >= 1)
        assert case.engine.stats is None or isinstance(case.engine.stats, EngineStats)
        assert isinstance(case.engine.compute_cpus(), set)

    def test_closing_is_safe_again_and_again(self, case: EngineCase):
        case.close_twice()
