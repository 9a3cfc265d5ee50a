"""Slot counting against KV-aware admission on a real vLLM engine (CPU build, tiny model)
whose KV cache binds before its slots do: 8 blocks of 128 tokens (7 of which requests can
hold, one being vLLM's own) under 16 sequences. A burst of short prompts (one block each)
and long ones (about 490 tokens with their output: four blocks) goes through the whole
platform twice, on one engine:

1. Slot counting (`kv_overcommit` so large that no claim ever binds, which is how
   admission and the worker behaved before KV claims): the worker hands the engine all
   16 slots' worth, the engine queues what its cache cannot hold where no deadline or
   share applies, and preempts running work when longs outgrow their blocks (its own
   count, and the heartbeats', rise); the long class's time to first token is far over
   its objective (`LONG_TTFT_SLO_S`).
2. KV-aware (`kv_overcommit` 1.0): the worker starts work only while its claims fit the
   blocks requests can hold, so the engine never queues inside and preempts nothing; the
   wait is in the platform's queue instead, which admission counts (claims past the cache,
   queue depth) and bounds: with `admission_queued_per_slot` 0.5, claims of half a cache
   more may wait, and what the burst offers beyond is shed as `kv_capacity` (503).

Each phase ends with every admitted request ended and settled once, every refused one
never started, and admission's claims back at 0. The KV-aware phase serves only what its
bound admits of the burst, so its TTFT is not held against slot counting's here; it
asserts no preemption and a bounded, visible queue (tests/perf/bench_kv_admission.py
compares the two at equal offered load). The embedded log only: what is decided here does
not depend on the log.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from models import topics
from models.capacity_inputs import model_shape_from_config
from models.capacity_plan import kv_plan
from models.prompt_class import PromptThresholds
from models.settings import Settings
from pipelines.admission.capacity import key_of
from pipelines.admission.kv_claims import kv_limit
from tests.conftest import make_log_opener
from tests.engine_fixture import ENGINE_START_TIMEOUT_S, engine_processes
from tests.fleet_pool import assert_ended_and_settled_once, of_tenant, outcomes_by_request, requests_of
from tests.harness import MODEL_ALIAS, Platform
from tests.helpers import wait_until
from workers.engine_runner import EngineRunner
from workers.vllm_engine import GiB, VllmEngine, VllmEngineConfig

BLOCK, BLOCKS, SLOTS, MAX_MODEL_LEN = 128, 8, 16, 512
LONGS, SHORTS = 8, 16
LONG_OUTPUT, SHORT_OUTPUT = 200, 16
LONG_TTFT_SLO_S = 0.5  # the long class's objective; one alone on this engine takes about 0.1 s
CLASSES = PromptThresholds(short_max_tokens=64, long_min_tokens=256)
QUEUED_PER_SLOT = 0.5  # KV claims of half a cache may wait beyond what runs
LONG_TEXT = "the ledger " * 140  # 281 tokens of the tiny model's tokenizer, a few more with its tag


def small_kv_engine(model: Path, blocks: int = BLOCKS) -> VllmEngine:
    """An engine whose cache is `blocks` blocks, sized by the capacity plan's bytes per token
    (tests/perf/bench_kv_admission.py runs on it too)."""
    config = json.loads((model / "config.json").read_text())
    per_token = kv_plan(model_shape_from_config(config, dtype="float32"), context_tokens=MAX_MODEL_LEN,
                        kv_budget_gb=1.0).bytes_per_token
    return VllmEngine(VllmEngineConfig(model=model, max_model_len=MAX_MODEL_LEN, max_num_seqs=SLOTS,
                                       kv_cache_gb=blocks * BLOCK * per_token / GiB))


@dataclass
class Phase:
    answers: list[dict] = field(default_factory=list)  # request_id, class, status, code, ttft_s, output_tokens
    preemptions: int = 0  # of the engine, over the burst
    engine_waiting: int = 0  # the most the engine held waiting in a step
    most_claims: int = 0  # the most KV tokens admission held claimed
    most_queued: int = 0  # the most requests admission held queued
    kv_capacity: int = 0  # the claims admission admits at once
    heartbeat_preemptions: tuple[int, int] = (0, 0)  # the worker's heartbeats, before and after

    @property
    def served(self) -> list[dict]:
        return [a for a in self.answers if a["status"] == 200]

    def ttft_p95(self, cls: str) -> float:
        values = sorted(a["ttft_s"] for a in self.served if a["class"] == cls)
        return values[min(len(values) - 1, round(0.95 * (len(values) - 1)))] if values else float("nan")


def stream_one(platform: Platform, secret: str, prompt: str, max_output_tokens: int, cls: str) -> dict:
    """One streamed generation to its end (or its refusal): what it was and its client-side TTFT."""
    body = {"model_alias": MODEL_ALIAS, "input": f"{uuid.uuid4().hex[:8]} {prompt}",  # no shared prefix
            "max_output_tokens": max_output_tokens, "ignore_eos": True, "stream": True}
    began, ttft, final = time.perf_counter(), None, {}
    with platform.client(secret) as client, client.stream("POST", "/v1/generations", json=body) as response:
        if response.status_code != 200:
            error = json.loads(response.read())["error"]
            return {"status": response.status_code, "code": error["code"], "class": cls}
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if ttft is None and event.get("type") == "tokens":
                ttft = time.perf_counter() - began
            final = event
    usage = final.get("usage", {})
    return {"request_id": final.get("request_id"), "status": 200, "code": final.get("type"), "ttft_s": ttft,
            "class": CLASSES.classify(usage.get("input_tokens", 0)), "output_tokens": usage.get("output_tokens")}


def heartbeat_after(platform: Platform, worker_id: str, seq: int):
    """The worker's state from a heartbeat later than `seq`, as admission's fleet view read it."""
    def newer():
        state = platform.admission.fleet.view.worker(worker_id)
        return state if state is not None and state.seq > seq and state.kv_tokens_used == 0 else None
    return wait_until(newer, 30, what="a heartbeat from after the burst")


def run_phase(runner: EngineRunner, home: Path, overcommit: float) -> Phase:
    engine, phase = runner.engine, Phase()
    settings = Settings(home=home, grace_s=5.0, default_deadline_ms=60_000, decision_timeout_s=20.0,
                        kv_overcommit=overcommit, admission_queued_per_slot=QUEUED_PER_SLOT)
    platform = Platform(make_log_opener("embedded", home), runner, settings, max_in_flight=SLOTS)
    try:
        tenant_id, secret = platform.tenant()
        key, book = key_of(None, platform.model_revision), platform.admission.capacity
        worker_id = platform.worker.worker_id
        assert stream_one(platform, secret, "warm", 4, "short")["code"] == "completed"
        warm = requests_of(platform, tenant_id)
        phase.kv_capacity = wait_until(lambda: book.kv_capacity(key), 30, what="admission to know the engine's KV")
        before = heartbeat_after(platform, worker_id, -1)
        preempted = engine.kv_figures().preemptions
        done = threading.Event()

        def sample() -> None:  # a look each engine step or so at where the burst waits
            while not done.wait(0.005):
                depth = book.queue_signals(datetime.now(timezone.utc)).get(key, (0, 0.0))[0]
                phase.engine_waiting = max(phase.engine_waiting, engine.stats.waiting)
                phase.most_claims = max(phase.most_claims, book.claims(key))
                phase.most_queued = max(phase.most_queued, depth)
        sampler = threading.Thread(target=sample, name="kv-sampler", daemon=True)
        sampler.start()
        work = [(LONG_TEXT, LONG_OUTPUT, "long")] * LONGS + [("hello there", SHORT_OUTPUT, "short")] * SHORTS
        try:
            with ThreadPoolExecutor(len(work)) as senders:
                phase.answers = list(senders.map(lambda w: stream_one(platform, secret, *w), work))
        finally:
            done.set()
            sampler.join(10)
        platform.check()
        phase.preemptions = engine.kv_figures().preemptions - preempted
        after = heartbeat_after(platform, worker_id, before.seq)
        phase.heartbeat_preemptions = (before.preemptions, after.preemptions)
        assert_each_ended_once(platform, tenant_id, phase, sent=requests_of(platform, tenant_id) - warm)
        wait_until(lambda: book.claims(key) == 0, 30, what="admission's claims to go back to 0")
        assert book.kv_claims.on_worker(worker_id) == 0
        return phase
    finally:
        platform.close()


def assert_each_ended_once(platform: Platform, tenant_id: str, phase: Phase, *, sent: set[str]) -> None:
    """Served requests made all their tokens and ended and settled once; refused ones were
    refused once, as `kv_capacity`, and never started."""
    assert len(sent) == len(phase.answers) and len(phase.served) >= 2, phase.answers
    assert all(a["code"] == "completed" for a in phase.served), phase.answers
    assert all(a["output_tokens"] == (LONG_OUTPUT if a["class"] == "long" else SHORT_OUTPUT)
               for a in phase.served), phase.served
    assert {a["code"] for a in phase.answers if a["status"] != 200} <= {"kv_capacity"}, phase.answers
    served = {a["request_id"] for a in phase.served}
    assert_ended_and_settled_once(platform, served)
    refused = sent - served
    rejections = Counter(env.correlation_id for env in of_tenant(platform, topics.LEDGER.name, tenant_id)
                         if env.event_type == "GenerationRejected")
    assert set(rejections) == refused and set(rejections.values()) <= {1}, (rejections, refused)
    assert not any(outcomes_by_request(platform, refused).values()), "a refused request was started"


def test_slot_counting_overfills_a_small_kv_cache_and_kv_claims_keep_it_within(tiny_model_dir, tmp_path, own_vllm):
    before = {p.pid for p in engine_processes()}  # the session's shared engine may be running
    runner = EngineRunner(small_kv_engine(tiny_model_dir), name="small-kv-engine")
    try:
        runner.start(timeout=ENGINE_START_TIMEOUT_S)
        figures = runner.engine.kv_figures()
        assert (figures.capacity_tokens, figures.block_tokens) == (BLOCKS * BLOCK, BLOCK)
        slots = run_phase(runner, tmp_path / "slots", overcommit=1e6)
        kv = run_phase(runner, tmp_path / "kv", overcommit=1.0)
    finally:
        runner.close()
    assert not [p for p in engine_processes() if p.pid not in before], "vLLM processes outlived the engine"
    report = {name: {"preemptions": p.preemptions, "engine waiting": p.engine_waiting, "served": len(p.served),
                     "long ttft p95": round(p.ttft_p95("long"), 2), "short ttft p95": round(p.ttft_p95("short"), 2),
                     "claims": p.most_claims, "queued": p.most_queued} for name, p in (("slots", slots), ("kv", kv))}
    limit = kv_limit(kv.kv_capacity, priority="normal", queue_factor=QUEUED_PER_SLOT, high_factor=2.0)

    # Slot counting: all of the burst is admitted and handed to the engine, which queues what
    # its cache cannot hold out of the platform's sight and preempts; the heartbeats say so;
    # long prompts wait far past their objective.
    assert len(slots.served) == LONGS + SHORTS, report
    assert slots.preemptions >= 1 and slots.engine_waiting >= 1, report
    assert slots.heartbeat_preemptions[1] - slots.heartbeat_preemptions[0] == slots.preemptions, report
    assert slots.ttft_p95("long") >= 2 * LONG_TTFT_SLO_S, report
    assert slots.most_claims > limit, "the burst's claims pass the bound KV-aware admission holds"

    # KV-aware: nothing preempted or queued inside the engine; the burst waits in admission's
    # queue, past the cache and within its bound, and what would pass the bound is shed.
    assert kv.preemptions == 0 and kv.engine_waiting == 0, report
    assert kv.heartbeat_preemptions[0] == kv.heartbeat_preemptions[1] == slots.heartbeat_preemptions[1], report
    assert kv.kv_capacity == BLOCKS * BLOCK, report
    assert kv.kv_capacity < kv.most_claims <= limit and kv.most_queued >= 1, report
    assert len(kv.served) < LONGS + SHORTS, report
