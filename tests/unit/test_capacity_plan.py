"""The capacity plan's arithmetic reproduces the seed's worked example figure by figure
(70B model, two 80 GiB GPUs, 100 requests/s × 300 tokens at 2,500 tokens/s per replica),
in GiB as the engine counts its KV cache, and its inputs are read from a model config and
a load test result as documented, a test that never saturated the service marked so."""
from __future__ import annotations

import math

import pytest

from models.capacity_inputs import measured_goodput, model_shape_from_config
from models.capacity_plan import GiB, ModelShape, PlanError, kv_plan, replica_plan

LLAMA_70B = ModelShape(layers=80, kv_heads=8, head_dim=128, dtype="float16")


def seed_kv():
    return kv_plan(LLAMA_70B, context_tokens=4000, gpu_memory_gb=80, gpus=2, weights_gb=140)


def seed_replicas(**overrides):
    figures = dict(peak_requests_per_s=100, output_tokens_per_request=300, per_replica_tokens_per_s=2500,
                   ceiling=0.7, failures=1, price_per_replica_hour=3)
    return replica_plan(**figures | overrides)


def test_the_seeds_kv_cache_figures():
    kv = seed_kv()
    assert kv.dtype_bytes == 2
    assert kv.bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680  # "about 320 KB": 320 KiB
    assert kv.bytes_per_token / 1024 == 320
    assert kv.bytes_per_sequence == 1_310_720_000  # "about 1.3 GB" for 4,000 tokens: 1.22 GiB
    assert round(kv.bytes_per_sequence / GiB, 2) == 1.22
    assert kv.kv_budget_bytes == 2 * 80 * GiB - 140 * GiB == 20 * GiB == 21_474_836_480
    assert kv.sequences_exact == pytest.approx(16.384, abs=1e-4)
    assert kv.concurrent_sequences == 16  # 15 if the budget were counted in 10^9 bytes
    assert kv.kv_tokens == 20 * GiB // 327_680 == 65_536


def test_a_budget_in_gib_is_the_engines_budget():
    # The engine sizes its KV cache as LEDGERLM_KV_CACHE_GB × 2^30 bytes (workers/vllm_engine.py);
    # the plan given the same figure counts the same bytes.
    engine_gib = 1 << 30
    assert GiB == engine_gib
    kv = kv_plan(LLAMA_70B, context_tokens=4000, kv_budget_gb=0.25)
    assert kv.kv_budget_bytes == int(0.25 * engine_gib) == 268_435_456


def test_a_given_kv_budget_replaces_memory_less_weights():
    kv = kv_plan(LLAMA_70B, context_tokens=4000, kv_budget_gb=20)
    assert (kv.kv_budget_bytes, kv.concurrent_sequences, kv.gpus, kv.weights_bytes) == (20 * GiB, 16, None, None)
    fp8 = kv_plan(ModelShape(80, 8, 128, "fp8"), context_tokens=4000, kv_budget_gb=20)
    assert (fp8.bytes_per_token, fp8.concurrent_sequences) == (163_840, 32)


def test_the_seeds_replica_figures():
    r = seed_replicas()
    assert r.demand_tokens_per_s == 100 * 300 == 30_000
    assert r.floor_replicas == 12  # 30,000 / 2,500
    assert r.usable_tokens_per_replica == 1750
    assert r.ceiling_replicas == 18  # 30,000 / 1,750 = 17.14
    assert (r.survivors_at_ceiling_plan, r.survivors_tokens_per_s) == (17, 29_750)  # 17 × 2,500 × 0.7
    assert r.ceiling_plan_survives is False  # 29,750 < 30,000
    assert r.replicas == 19
    assert (r.survivors, r.survivors_capacity_tokens_per_s) == (18, 31_500)
    assert r.hours_per_month == 730
    assert r.monthly_cost == 19 * 730 * 3 == 41_610
    assert r.utilization_at_peak == pytest.approx(30_000 / (19 * 2500))
    assert r.utilization_after_failures == pytest.approx(30_000 / (18 * 2500))


@pytest.mark.parametrize("failures, replicas", [(0, 18), (1, 19), (2, 20), (5, 23)])
def test_each_loss_to_survive_adds_a_replica(failures, replicas):
    r = seed_replicas(failures=failures)
    assert r.replicas == replicas
    assert (r.replicas - failures) * 1750 >= 30_000 > (r.replicas - failures - 1) * 1750
    assert r.ceiling_plan_survives is (failures == 0)


def test_whole_quotients_are_not_rounded_up_by_float_error():
    # In floats 0.1 × 3 is 0.30000000000000004, and its ceiling over 0.3 would be 2.
    assert math.ceil(0.1 * 3 / 0.3) == 2
    r = replica_plan(peak_requests_per_s=0.1, output_tokens_per_request=3, per_replica_tokens_per_s=0.3,
                     ceiling=1.0, failures=0)
    assert (r.demand_tokens_per_s, r.floor_replicas, r.replicas) == (0.3, 1, 1)
    assert seed_replicas(peak_requests_per_s=350, output_tokens_per_request=100, failures=0).replicas == 20


def test_no_price_means_no_cost():
    assert seed_replicas(price_per_replica_hour=None).monthly_cost is None
    assert seed_replicas(price_per_replica_hour=2.5).monthly_cost == 19 * 730 * 2.5


@pytest.mark.parametrize("overrides, words", [
    ({"peak_requests_per_s": -100}, "peak requests/s"),
    ({"peak_requests_per_s": 0}, "peak requests/s"),
    ({"output_tokens_per_request": float("nan")}, "output tokens"),
    ({"per_replica_tokens_per_s": float("inf")}, "per-replica"),
    ({"ceiling": 0}, "ceiling"),
    ({"ceiling": 1.2}, "ceiling"),
    ({"failures": -1}, "failures"),
    ({"price_per_replica_hour": -3}, "price"),
])
def test_bad_replica_inputs_are_refused_by_name(overrides, words):
    with pytest.raises(PlanError, match=words):
        seed_replicas(**overrides)


@pytest.mark.parametrize("call, words", [
    (lambda: kv_plan(LLAMA_70B, context_tokens=4000, gpu_memory_gb=80, gpus=2, weights_gb=160), "no room"),
    (lambda: kv_plan(LLAMA_70B, context_tokens=4000, gpu_memory_gb=80, weights_gb=-1), "weights"),
    (lambda: kv_plan(LLAMA_70B, context_tokens=0, kv_budget_gb=20), "context tokens"),
    (lambda: kv_plan(LLAMA_70B, context_tokens=4000, kv_budget_gb=20, gpu_memory_gb=80), "not both"),
    (lambda: kv_plan(LLAMA_70B, context_tokens=4000, gpu_memory_gb=80), "weights"),
    (lambda: kv_plan(LLAMA_70B, context_tokens=4000, gpu_memory_gb=80, gpus=0, weights_gb=1), "GPUs"),
    (lambda: ModelShape(layers=-80, kv_heads=8, head_dim=128, dtype="fp16"), "layers"),
    (lambda: ModelShape(layers=80, kv_heads=8, head_dim=128, dtype="float13"), "unknown dtype"),
])
def test_bad_kv_inputs_are_refused_by_name(call, words):
    with pytest.raises(PlanError, match=words):
        call()


LLAMA_70B_CONFIG = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                    "hidden_size": 8192, "torch_dtype": "bfloat16"}


def test_a_config_gives_the_kv_shape_with_its_defaults():
    assert model_shape_from_config(LLAMA_70B_CONFIG) == ModelShape(80, 8, 128, "bfloat16")  # head dim 8192 / 64
    no_gqa = {k: v for k, v in LLAMA_70B_CONFIG.items() if k != "num_key_value_heads"}
    assert model_shape_from_config(no_gqa).kv_heads == 64  # every attention head keeps its own K and V
    newer = {**LLAMA_70B_CONFIG, "head_dim": 96, "dtype": "float32"} | {"torch_dtype": None}
    assert model_shape_from_config(newer) == ModelShape(80, 8, 96, "float32")
    assert model_shape_from_config(LLAMA_70B_CONFIG, dtype="fp8").dtype == "fp8"  # an fp8 KV cache
    multimodal = {"torch_dtype": "bfloat16", "text_config": {k: v for k, v in LLAMA_70B_CONFIG.items()
                                                             if k != "torch_dtype"}}
    assert model_shape_from_config(multimodal) == ModelShape(80, 8, 128, "bfloat16")


@pytest.mark.parametrize("config, words", [
    ({**LLAMA_70B_CONFIG, "num_hidden_layers": None}, "num_hidden_layers"),
    ({**LLAMA_70B_CONFIG, "num_key_value_heads": 0}, "num_key_value_heads"),
    ({**LLAMA_70B_CONFIG, "torch_dtype": None}, "dtype"),
    ({**LLAMA_70B_CONFIG, "hidden_size": 8190}, "multiple"),
    ({**LLAMA_70B_CONFIG, "kv_lora_rank": 512}, "latent"),
    ([], "object"),
])
def test_an_unusable_config_is_refused_by_name(config, words):
    with pytest.raises(PlanError, match=words):
        model_shape_from_config(config)


def step(goodput: float, meets_slo: bool, rate: float) -> dict:
    return {"mode": "rate", "rate": rate, "concurrency": None, "duration_s": 30.0, "requests": 300,
            "requests_per_s": rate, "output_tokens_per_s": goodput * 1.1, "goodput_requests_per_s": rate * 0.9,
            "goodput_output_tokens_per_s": goodput, "meets_slo": meets_slo, "rejections": {}, "failures": 0}


def result(*steps: dict, replicas: int = 2) -> dict:
    return {"target": "http://platform", "model": "tiny", "replicas": replicas,
            "slo": {"ttft_p95_ms": 500.0, "tpot_p95_ms": 50.0}, "steps": list(steps), "knee": 1}


def test_the_per_replica_figure_is_the_best_goodput_at_the_slo_per_replica():
    measured = measured_goodput(result(step(3000, True, 4), step(5000, True, 8), step(6000, False, 16)))
    assert (measured.goodput_output_tokens_per_s, measured.per_replica_tokens_per_s) == (5000, 2500)
    assert (measured.step, measured.step_rate, measured.steps, measured.steps_meeting_slo) == (2, 8, 3, 2)
    assert measured.slo == {"ttft_p95_ms": 500.0, "tpot_p95_ms": 50.0}
    assert measured.unsaturated is None  # step 3 broke the SLO: the sweep reached saturation


def numbered(*steps: dict) -> list[dict]:
    return [{**s, "step": n} for n, s in enumerate(steps, start=1)]


def test_the_best_step_is_numbered_from_1_as_the_load_test_numbers_it():
    doc = result(*numbered(step(3000, True, 4), step(5000, True, 8), step(4000, False, 16)))
    assert measured_goodput(doc).step == 2
    # Steps count from 1 in the file; older files, without the numbers, count by place.
    doc["steps"] = [{**s, "step": n} for n, s in zip((4, 5, 6), doc["steps"])]
    assert measured_goodput(doc).step == 5


def test_a_test_whose_best_step_is_its_last_with_no_slo_broken_never_saturated():
    doc = result(*numbered(step(3000, True, 4), step(5000, True, 8)))
    doc["knee_reason"] = "sweep ended"
    measured = measured_goodput(doc)
    assert measured.unsaturated is not None and measured.goodput_output_tokens_per_s == 5000
    assert "did not reach saturation" in measured.unsaturated
    assert "step 2 of 2, rate 8 requests/s" in measured.unsaturated and "overstate" in measured.unsaturated
    one_rate = result(step(3000, True, 4))  # a single fixed-rate run that met the SLO: the same
    assert measured_goodput(one_rate).unsaturated is not None


@pytest.mark.parametrize("steps, knee_reason", [
    ((step(3000, True, 4), step(5000, True, 8), step(4000, False, 16)), "slo broken at step 3"),
    ((step(3000, True, 4), step(5000, False, 8), step(6000, True, 16)), None),  # a broken step, whatever the file says
    ((step(3000, True, 4), step(3050, True, 8)), "throughput stopped rising at step 2"),
    ((step(3000, True, 4), step(5000, True, 8), step(4500, True, 16)), "sweep ended"),  # best is not the last
])
def test_a_test_that_reached_saturation_is_not_marked(steps, knee_reason):
    doc = result(*numbered(*steps))
    doc["knee_reason"] = knee_reason
    assert measured_goodput(doc).unsaturated is None


@pytest.mark.parametrize("doc, words", [
    (result(step(6000, False, 16), step(0, True, 1)), "no step of the load test met its SLO"),
    (result(), "no step"),
    (result(step(5000, True, 8), replicas=0), "replicas"),
    ({"steps": "none"}, "not a load test result"),
])
def test_a_result_without_a_usable_figure_is_refused(doc, words):
    with pytest.raises(PlanError, match=words):
        measured_goodput(doc)
