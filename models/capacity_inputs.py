"""The planner's inputs from what users already have: a Hugging Face model's `config.json`
(its KV-cache shape) and a `ledgerlm loadtest` result (the measured per-replica goodput).
Pure functions of parsed JSON; reading the files is the caller's."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from models.capacity_plan import ModelShape, PlanError


def model_shape_from_config(config: dict[str, Any], *, dtype: str | None = None) -> ModelShape:
    """`num_hidden_layers`, `num_key_value_heads` (default `num_attention_heads`), `head_dim`
    (default `hidden_size / num_attention_heads`) and the dtype (`torch_dtype`, or `dtype`
    as newer transformers write it), unless `dtype` overrides it (an fp8 KV cache on fp16
    weights, say)."""
    if not isinstance(config, dict):
        raise PlanError("config.json does not hold an object")
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        # Multimodal configs keep the language model's shape under text_config.
        config = {"torch_dtype": config.get("torch_dtype"), "dtype": config.get("dtype"), **config["text_config"]}
    if config.get("kv_lora_rank"):
        raise PlanError("this model compresses its KV cache (multi-head latent attention, kv_lora_rank): "
                        "2 × layers × KV heads × head dim does not size it")

    def whole(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise PlanError(f"config.json: {key} must be a positive whole number, not {value!r}")
        return value

    def field(key: str) -> int:
        if config.get(key) is None:
            raise PlanError(f"config.json has no {key}")
        return whole(key, config[key])

    layers = field("num_hidden_layers")
    heads = field("num_attention_heads")
    kv_heads = whole("num_key_value_heads", config["num_key_value_heads"]) \
        if config.get("num_key_value_heads") is not None else heads
    if config.get("head_dim") is not None:
        head_dim = whole("head_dim", config["head_dim"])
    else:
        hidden = field("hidden_size")
        if hidden % heads:
            raise PlanError(f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
                            "give the head dim")
        head_dim = hidden // heads
    dtype = dtype or config.get("torch_dtype") or config.get("dtype")
    if not isinstance(dtype, str):
        raise PlanError("config.json names no dtype (torch_dtype): give one")
    return ModelShape(layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)


@dataclass(frozen=True, slots=True)
class MeasuredGoodput:
    """The best goodput a load test measured at its SLO, and per replica."""

    target: str | None
    model: str | None
    replicas: int
    slo: dict[str, Any]
    steps: int
    steps_meeting_slo: int
    step: int  # the best step's number, counting from 1 as the load test's output does
    step_mode: str | None
    step_rate: float | None
    step_concurrency: int | None
    goodput_output_tokens_per_s: float  # over all the target's replicas
    per_replica_tokens_per_s: float
    # Why the figure may be below what the service can do (None: the test reached saturation).
    unsaturated: str | None = None

    def load(self) -> str:
        """The best step's load in words: `rate 8 requests/s`, `concurrency 4`."""
        if self.step_rate is not None:
            return f"rate {self.step_rate:g} requests/s"
        if self.step_concurrency is not None:
            return f"concurrency {self.step_concurrency}"
        return self.step_mode or "load not recorded"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _unsaturated(result: dict, steps: list, best_index: int) -> bool:
    """A test that never saturated the service: its best step is its last, no step broke
    the SLO, and its throughput never stopped rising (a sweep records why it ended)."""
    broke = any(isinstance(step, dict) and step.get("meets_slo") is False for step in steps)
    stopped = str(result.get("knee_reason") or "").startswith("throughput stopped rising")
    return best_index == len(steps) - 1 and not broke and not stopped


def measured_goodput(result: Any) -> MeasuredGoodput:
    """From a `ledgerlm loadtest` result: the largest `goodput_output_tokens_per_s` among
    the steps that met the SLO, divided by the replicas the target had. When the test never
    saturated the service (`_unsaturated`), `unsaturated` says so: the figure is then only
    what was offered, and a plan from it would overstate the replicas."""
    if not isinstance(result, dict) or not isinstance(result.get("steps"), list):
        raise PlanError("not a load test result: expected an object with a list of steps")
    replicas = result.get("replicas")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas <= 0:
        raise PlanError(f"the load test result gives no positive number of replicas ({replicas!r})")
    slo = result.get("slo") if isinstance(result.get("slo"), dict) else {}
    steps = result["steps"]
    met = [(i, step) for i, step in enumerate(steps)
           if isinstance(step, dict) and step.get("meets_slo") is True
           and (_number(step.get("goodput_output_tokens_per_s")) or 0) > 0]
    if not met:
        limits = ", ".join(f"{k} ≤ {v:g}" for k, v in slo.items() if _number(v) is not None) or "none recorded"
        raise PlanError(f"no step of the load test met its SLO ({limits}; {len(steps)} steps): the measured "
                        "throughput is not a rate the service can be planned at. Run it at lower rates, or give "
                        "the per-replica figure as a number")
    index, best = max(met, key=lambda pair: pair[1]["goodput_output_tokens_per_s"])
    goodput = float(best["goodput_output_tokens_per_s"])
    concurrency = best.get("concurrency")
    number = best.get("step")  # results written before steps carried their number: its place
    out = MeasuredGoodput(
        target=result.get("target"), model=result.get("model"), replicas=replicas, slo=dict(slo), steps=len(steps),
        steps_meeting_slo=len(met), step=number if isinstance(number, int) and number > 0 else index + 1,
        step_mode=best.get("mode"), step_rate=_number(best.get("rate")),
        step_concurrency=concurrency if isinstance(concurrency, int) else None,
        goodput_output_tokens_per_s=goodput, per_replica_tokens_per_s=goodput / replicas)
    if not _unsaturated(result, steps, index):
        return out
    why = (f"the load test did not reach saturation: its best step is its last (step {out.step} of {out.steps}, "
           f"{out.load()}) and no step broke the SLO, so the service may serve more than was measured and the "
           "plan would overstate the replicas")
    return replace(out, unsaturated=why)
