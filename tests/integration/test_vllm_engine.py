"""The vLLM adapter against a real engine (CPU build, tiny generated model). One engine is
shared by the session (`tests.engine_fixture`); only the shutdown test starts its own."""
from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest

from tests.engine_fixture import engine_processes, tiny_engine_config
from tests.helpers import wait_until
from workers.engine import EngineDelta, EngineError, EngineRequest, InvalidEngineRequest
from workers.engine_runner import EngineRunner
from workers.vllm_engine import VllmEngine


DELTA_TIMEOUT_S = 60.0
LONG_TEXT = (
    "The ledger is the oldest database. A merchant wrote down every sale, every loan and "
    "every debt in a book that nobody was allowed to erase. "
) * 12


def request(prompt: str = "The clerk keeps the books", **fields) -> EngineRequest:
    fields.setdefault("max_output_tokens", 16)
    fields.setdefault("tenant_id", "tenant-a")
    return EngineRequest(request_id=f"req-{uuid.uuid4().hex[:12]}", prompt=prompt, **fields)


def collect(runner: EngineRunner, req: EngineRequest) -> list[EngineDelta]:
    return list(runner.stream(req, timeout=DELTA_TIMEOUT_S))


def test_stream_token_counts_add_up_to_the_final_count(engine_runner, vllm_engine):
    deltas = collect(engine_runner, request(max_output_tokens=24, ignore_eos=True))
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert sum(d.new_tokens for d in deltas) == deltas[-1].output_tokens == 24
    running = 0
    for delta in deltas:
        running += delta.new_tokens
        assert delta.output_tokens == running
    assert deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert "".join(d.text for d in deltas)


def test_output_never_exceeds_max_tokens_without_ignore_eos(engine_runner):
    for seed in range(3):
        deltas = collect(engine_runner, request(max_output_tokens=8, seed=seed))
        assert deltas[-1].output_tokens <= 8
        assert deltas[-1].finish_reason in {"stop", "length"}


def test_prompt_tokens_match_count_tokens(engine_runner, vllm_engine):
    for prompt in ["Hi", "The clerk keeps the books, and the auditor reads them.", LONG_TEXT]:
        deltas = collect(engine_runner, request(prompt, max_output_tokens=2))
        assert deltas[0].prompt_tokens == vllm_engine.count_tokens(prompt)
        assert all(d.prompt_tokens == deltas[0].prompt_tokens for d in deltas)


@pytest.mark.timing
def test_abort_ends_the_stream_promptly(engine_runner, vllm_engine):
    req = request(max_output_tokens=400, ignore_eos=True)
    stream = engine_runner.stream(req, timeout=DELTA_TIMEOUT_S)
    first = next(stream)
    assert not first.finished
    engine_runner.submit(vllm_engine.abort(req.request_id), timeout=10)
    aborted_at = time.monotonic()
    rest = list(stream)
    assert time.monotonic() - aborted_at < 5.0
    assert rest and rest[-1].finished and rest[-1].finish_reason == "abort"
    assert rest[-1].output_tokens < 400
    wait_until(lambda: vllm_engine.unfinished_requests() == 0, 10, what="the engine to forget the request")


def test_leaving_a_stream_early_aborts_the_request(engine_runner, vllm_engine):
    for delta in engine_runner.stream(
        request(max_output_tokens=400, ignore_eos=True), timeout=DELTA_TIMEOUT_S
    ):
        break
    wait_until(lambda: vllm_engine.unfinished_requests() == 0, 10, what="the engine to forget the request")


def test_abort_of_unknown_request_is_ignored(engine_runner, vllm_engine):
    engine_runner.submit(vllm_engine.abort("never-submitted"), timeout=10)
    assert engine_runner.submit(vllm_engine.health(), timeout=10)


def test_prefix_cache_is_salted_per_tenant(engine_runner):
    # Longer than one KV block (128 tokens on CPU), and new to this engine.
    prompt = f"{uuid.uuid4()} {LONG_TEXT}"
    first = collect(engine_runner, request(prompt, tenant_id="tenant-a", max_output_tokens=2))
    again = collect(engine_runner, request(prompt, tenant_id="tenant-a", max_output_tokens=2))
    other = collect(engine_runner, request(prompt, tenant_id="tenant-b", max_output_tokens=2))
    assert first[-1].cached_prompt_tokens == 0
    assert again[-1].cached_prompt_tokens >= 128  # the same tenant reuses its blocks
    assert other[-1].cached_prompt_tokens == 0  # another tenant never sees them
    assert other[-1].output_tokens == 2


def test_tenant_is_required(engine_runner):
    with pytest.raises(InvalidEngineRequest):
        collect(engine_runner, request(tenant_id=""))


def test_lower_priority_value_gets_the_next_free_seat(engine_runner, vllm_engine):
    # vLLM 0.32 orders its waiting queue by (priority, arrival) and picks preemption victims
    # by priority under KV pressure; it does not evict a running request to free a seat.
    # The seat is freed on purpose (one holder aborted), once both waiters are queued: a
    # seat that came free by itself could go before the second waiter arrived on a slow host.
    seats = 8  # max_num_seqs of the session engine

    async def scenario() -> list[tuple[str, str | None]]:
        ended: list[tuple[str, str | None]] = []
        started = [asyncio.Event() for _ in range(seats)]

        async def run(name: str, req: EngineRequest, started: asyncio.Event | None = None):
            delta = None
            async for delta in vllm_engine.generate(req):
                if started is not None:
                    started.set()
            ended.append((name, None if delta is None else delta.finish_reason))

        async def until(condition) -> None:
            while not condition():
                await asyncio.sleep(0.001)

        eos = {"ignore_eos": True}
        holders = [request(priority=5, max_output_tokens=400, **eos) for _ in range(seats)]
        tasks = [asyncio.create_task(run(f"long{i}", r, e)) for i, (r, e) in enumerate(zip(holders, started))]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        short = {"max_output_tokens": 8, "ignore_eos": True}
        tasks.append(asyncio.create_task(run("patient", request(priority=9, **short))))
        await asyncio.wait_for(until(lambda: vllm_engine.unfinished_requests() >= seats + 1), 30)  # patient first
        tasks.append(asyncio.create_task(run("urgent", request(priority=0, **short))))
        await asyncio.wait_for(until(lambda: vllm_engine.unfinished_requests() >= seats + 2), 30)
        await vllm_engine.abort(holders[0].request_id)
        await asyncio.wait_for(until(lambda: any(name == "patient" for name, _ in ended)), 120)
        for holder in holders[1:]:
            await vllm_engine.abort(holder.request_id)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        return ended

    ended = engine_runner.submit(scenario(), timeout=240)
    # Both waited for long0's seat; urgent took it though patient came first, and patient
    # got the seat urgent left, while every other holder still ran.
    assert ended[0][0] == "long0"
    assert ended[1:3] == [("urgent", "length"), ("patient", "length")]
    assert all(reason != "length" for name, reason in ended if name.startswith("long"))


def test_concurrent_streams_each_get_their_own_tokens(engine_runner):
    async def run_all() -> list[list[EngineDelta]]:
        async def one(i: int) -> list[EngineDelta]:
            req = request(f"Story number {i}:", max_output_tokens=10 + i, ignore_eos=True)
            return [d async for d in engine_runner.engine.generate(req)]

        return await asyncio.gather(*(one(i) for i in range(8)))

    for i, deltas in enumerate(engine_runner.submit(run_all(), timeout=120)):
        assert deltas[-1].output_tokens == 10 + i
        assert len({d.request_id for d in deltas}) == 1


def test_seeded_sampling_is_reproducible(engine_runner):
    texts = [
        "".join(d.text for d in collect(engine_runner, request(seed=7, temperature=1.0)))
        for _ in range(2)
    ]
    assert texts[0] == texts[1]


def test_stop_string_ends_generation(engine_runner):
    first = collect(engine_runner, request(seed=3, max_output_tokens=12, ignore_eos=True))
    text = "".join(d.text for d in first)
    stop = text[len(text) // 2 :][:3]
    assert stop.strip()
    deltas = collect(
        engine_runner, request(seed=3, max_output_tokens=12, ignore_eos=True, stop=(stop,))
    )
    assert deltas[-1].finish_reason == "stop"
    assert stop not in "".join(d.text for d in deltas)


def test_prompt_longer_than_the_model_allows_is_invalid(engine_runner):
    with pytest.raises(InvalidEngineRequest):
        collect(engine_runner, request(LONG_TEXT * 3))


def test_health_and_revision(engine_runner, vllm_engine):
    assert engine_runner.submit(vllm_engine.health(), timeout=10) is True
    assert len(vllm_engine.engine_config_hash()) == 12


def test_a_crashed_engine_reports_unhealthy_and_close_reaps_everything(tiny_model_dir, own_vllm):
    before = {p.pid for p in engine_processes()}  # the session engine's, if started
    engine = VllmEngine(tiny_engine_config(tiny_model_dir))
    with EngineRunner(engine) as runner:
        mine = [p for p in engine_processes() if p.pid not in before]
        assert sorted(p.name()[:10] for p in mine) == ["VLLM::Engi", "VLLM::Work"]
        deltas = collect(runner, request(max_output_tokens=3, ignore_eos=True))
        assert deltas[-1].output_tokens == 3
        core = next(p for p in mine if p.name().startswith("VLLM::EngineCor"))
        core.kill()
        wait_until(lambda: not runner.submit(engine.health(), timeout=10), 30, what="the engine to report unhealthy")
        with pytest.raises(EngineError):
            collect(runner, request())
    assert not [p for p in engine_processes() if p.pid not in before]
    with pytest.raises(RuntimeError):
        runner.submit(engine.health())


def test_engine_processes_run_below_the_platform(vllm_engine):
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    processes = engine_processes()
    assert processes
    for process in processes:
        for thread in process.threads():
            assert os.getpriority(os.PRIO_PROCESS, thread.id) >= min(19, mine + vllm_engine.config.cpu_nice)


def test_a_pinned_engine_runs_every_process_on_its_compute_cpus(engine_runner, vllm_engine):
    """`LEDGERLM_ENGINE_PINNED`: vLLM binds only its compute threads; pinning moves the rest
    of its processes (the EngineCore scheduler above all) onto those CPUs, and it serves on."""
    cpus = vllm_engine.compute_cpus()
    assert cpus and cpus < os.sched_getaffinity(0), f"vLLM bound no compute thread to part of the host's CPUs: {cpus}"
    threads = [t.id for p in engine_processes() for t in p.threads()]
    before = {tid: os.sched_getaffinity(tid) for tid in threads}
    assert any(not cpus >= affinity for affinity in before.values()), "no thread was free to run elsewhere"
    try:
        assert vllm_engine.pin_to_compute_cpus() == cpus
        assert all(os.sched_getaffinity(tid) <= cpus for tid in threads)
        deltas = collect(engine_runner, request(max_output_tokens=3, ignore_eos=True))
        assert deltas[-1].output_tokens == 3
    finally:  # the session's engine goes back to how it was for the tests after this one
        for tid, affinity in before.items():
            try:
                os.sched_setaffinity(tid, affinity)
            except ProcessLookupError:
                pass
