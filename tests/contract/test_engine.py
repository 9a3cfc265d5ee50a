"""The `InferenceEngine` contract (`tests.contract.engine_contract`), run unchanged against
vLLM and against every stand-in a test runs a worker on.

vLLM is the session's one shared engine on the tiny random Llama (`tests.engine_fixture`):
this module starts none of its own, and its `engine_runner` fixture marks those tests
`vllm` (`tests.lanes`). The shared engine outlives the module, so its close is checked on
an engine like it that never started; the session closes the started one and checks that
none of its processes outlive it. Each stand-in is made for its test and closed with it:
`FakeEngine` (one token a request, or held until aborted), the `DyingEngine` before it dies,
`SlowEngine`, the benchmark's `SyntheticEngine`, the test wrappers `ThrottledEngine` and
`HeldEngine`, and the `WatchedEngine` a worker runs its generations on.

`LogprobsContract` is what log probabilities ask of an engine: a request that asks for none
gets none on its deltas (so other requests' token events carry nothing extra); an engine
that gives them (`max_logprobs()` is a number) gives each new token one entry, a log
probability <= 0 with the asked number of alternatives, likeliest first, whose tokens join
up to the text. An engine that gives none (`max_logprobs()` None) is never sent a request
asking for them: the worker fails such a request itself.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.contract.engine_contract import (
    DEADLINE_S, EngineCase, EngineContract, Generation, assert_one_stream, request,
)
from tests.dying_engine import DyingEngine
from tests.engine_fixture import tiny_engine_config
from tests.engine_wrappers import HeldEngine, ThrottledEngine
from tests.fake_engine import FakeEngine
from tests.helpers import wait_until
from tests.slow_engine import SlowEngine
from workers.engine import EngineDelta, EngineRequest, InferenceEngine
from workers.engine_runner import EngineRunner
from workers.engine_watch import EngineWatch, WatchedEngine
from workers.synthetic_engine import SyntheticEngine
from workers.vllm_engine import VllmEngine


ALTERNATIVES = 3


def _run(case: EngineCase, req: EngineRequest) -> list[EngineDelta]:
    generation = Generation(case.runner, case.engine, req)
    if case.ends_alone:
        return generation.ended()
    wait_until(lambda: case.started(generation), DEADLINE_S, what="the engine to take the request on")
    return case.abort_until_ended(generation)


class LogprobsContract:
    def test_a_request_that_asks_for_no_logprobs_gets_none(self, case: EngineCase):
        deltas = _run(case, request(4))
        assert [d.logprobs for d in deltas] == [None] * len(deltas)

    def test_an_engine_gives_the_logprobs_asked_for_or_says_it_gives_none(self, case: EngineCase):
        most = case.engine.max_logprobs()
        assert most is None or (isinstance(most, int) and most >= ALTERNATIVES), most
        if most is None:
            return  # the worker never sends it such a request (tests/unit/test_logprobs.py)
        req = replace(request(4), logprobs=ALTERNATIVES)
        deltas = _run(case, req)
        assert_one_stream(deltas, req)
        for delta in deltas:
            assert len(delta.logprobs or ()) == delta.new_tokens, delta
            for token in delta.logprobs or ():
                assert token.logprob <= 0.0
                assert len(token.top) == ALTERNATIVES
                chances = [lp for _, lp in token.top]
                assert chances == sorted(chances, reverse=True) and all(lp <= 0.0 for lp in chances)
        assert "".join(t.token for d in deltas for t in d.logprobs or ()) == "".join(d.text for d in deltas)


@dataclass
class VllmCase(EngineCase):
    model: Path | None = None

    def close_twice(self) -> None:
        """The shared engine outlives the test: an engine like it that never started closes
        safely, twice."""
        engine = VllmEngine(tiny_engine_config(self.model))
        engine.close()
        engine.close()


class TestVllm(EngineContract, LogprobsContract):
    @pytest.fixture
    def case(self, engine_runner: EngineRunner, tiny_model_dir: Path) -> EngineCase:
        return VllmCase(engine_runner, engine_runner.engine, model=tiny_model_dir)


class StandIns:
    """Starts stand-ins on runners of their own; closes every runner and watch at the end."""

    def __init__(self) -> None:
        self.runners: list[EngineRunner] = []
        self.watches: list[EngineWatch] = []

    def start(self, engine: InferenceEngine) -> EngineRunner:
        runner = EngineRunner(engine, name="contract-engine")
        self.runners.append(runner)
        return runner.start(timeout=60)

    def close(self) -> None:
        for watch in self.watches:
            watch.stop()
        for runner in self.runners:
            runner.close()


def _held_until(engine: FakeEngine) -> Callable[[Generation], bool]:
    """A held stream says nothing until it ends: the engine has it once it started it."""
    return lambda generation: generation.request.request_id in engine.started


def _fake(s: StandIns) -> EngineCase:
    engine = FakeEngine(hold=False, kv_tokens=1024)
    return EngineCase(s.start(engine), engine, runs_long=False)


def _fake_held(s: StandIns) -> EngineCase:
    engine = FakeEngine(hold=True)
    return EngineCase(s.start(engine), engine, ends_alone=False, started=_held_until(engine))


def _dying(s: StandIns) -> EngineCase:
    engine = DyingEngine()
    return EngineCase(s.start(engine), engine, ends_alone=False, started=_held_until(engine))


def _slow(s: StandIns) -> EngineCase:
    engine = SlowEngine(0.005, kv_tokens=4096)
    return EngineCase(s.start(engine), engine)


def _synthetic(s: StandIns) -> EngineCase:
    engine = SyntheticEngine(tokens_per_s=200.0, max_seqs=4)
    return EngineCase(s.start(engine), engine)


def _throttled(s: StandIns) -> EngineCase:
    engine = ThrottledEngine(SyntheticEngine(tokens_per_s=200.0), 0.001)
    return EngineCase(s.start(engine), engine)


def _held(s: StandIns) -> EngineCase:
    engine = HeldEngine(SlowEngine(0.005), hold_s=0.2)
    return EngineCase(s.start(engine), engine)


def _watched(s: StandIns) -> EngineCase:
    inner = SlowEngine(0.005)
    runner = s.start(inner)
    watch = EngineWatch(runner, inner, interval_s=0.2)
    s.watches.append(watch)
    engine = WatchedEngine(inner, watch, runner)
    watch.start(name="contract-engine-watch")
    return EngineCase(runner, engine)


STAND_INS = {"fake": _fake, "fake-held": _fake_held, "dying": _dying, "slow": _slow, "synthetic": _synthetic,
             "throttled": _throttled, "held": _held, "watched": _watched}


class TestStandIns(EngineContract, LogprobsContract):
    @pytest.fixture(params=list(STAND_INS))
    def case(self, request) -> Iterator[EngineCase]:
        stand_ins = StandIns()
        try:
            yield STAND_INS[request.param](stand_ins)
        finally:
            stand_ins.close()
