"""Capacity planning arithmetic, as pure functions returning every intermediate figure so a
caller can show the working.

Two questions, answered apart:

- **Memory**: how many sequences of a given context length fit in one replica's KV cache.
  KV bytes per token = 2 (K and V) × layers × KV heads × head dim × dtype bytes; the
  budget is the replica's GPU memory less its weights, or a figure given outright.
- **Throughput**: how many replicas serve a peak rate. Demand (output tokens/s) = requests/s
  × output tokens per request; each replica may run at `ceiling` of its measured goodput
  (output tokens/s while meeting the SLO), and the plan must still hold after `failures`
  replicas are lost.

Units: memory is in GiB (2^30 bytes), the unit the engine's `LEDGERLM_KV_CACHE_GB` is read
in (`workers/vllm_engine.py`), so a budget given here and one given the engine are the same
bytes; an "80 GB" GPU holds 80 GiB. An hour-based month is 730 hours (8,760 / 12).

Replica counts are rounded up with exact rational arithmetic on the decimal figures the
user gave, so 35,000 ÷ (2,500 × 0.7) is 20, not 21 by a float's last bit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

GiB = 1 << 30  # the unit of every memory figure given to the plan (and to the engine)
HOURS_PER_MONTH = 730
KV_TENSORS = 2  # one K and one V vector per token, layer and KV head

# Bytes per element of the KV cache, by the names configs and engines use.
DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "float8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1,
}


class PlanError(ValueError):
    """An input the plan cannot use, with a message that says which and why."""


def _exact(value: float | int) -> Fraction:
    # repr gives the shortest decimal that reads back as the same float: 0.7 -> 7/10 exactly.
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _positive(name: str, value: float | int) -> None:
    if not value > 0 or math.isinf(value):
        raise PlanError(f"{name} must be a positive number, not {value}")


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype.lower().removeprefix("torch.")]
    except KeyError:
        known = ", ".join(sorted(DTYPE_BYTES))
        raise PlanError(f"unknown dtype {dtype!r} (known: {known})") from None


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What of a model sizes its KV cache."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise PlanError(f"{name.replace('_', ' ')} must be a positive whole number, not {value!r}")
        dtype_bytes(self.dtype)


@dataclass(frozen=True, slots=True)
class KvPlan:
    """How many sequences of `context_tokens` fit in one replica's KV cache."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    dtype_bytes: int
    bytes_per_token: int
    context_tokens: int
    bytes_per_sequence: int
    gpus: int | None  # None when the KV budget was given outright
    gpu_memory_bytes: int | None  # per GPU
    weights_bytes: int | None
    kv_budget_bytes: int
    sequences_exact: float  # budget ÷ bytes per sequence, before rounding down
    concurrent_sequences: int
    kv_tokens: int  # tokens the budget holds, however they are split into sequences


def kv_plan(model: ModelShape, *, context_tokens: int, gpu_memory_gb: float | None = None, gpus: int = 1,
            weights_gb: float | None = None, kv_budget_gb: float | None = None) -> KvPlan:
    """The KV budget is `gpus × gpu_memory_gb − weights_gb`, or `kv_budget_gb` when given
    (then GPU memory and weights must not be). Every `_gb` figure is in GiB (2^30 bytes)."""
    if not isinstance(context_tokens, int) or context_tokens <= 0:
        raise PlanError(f"context tokens must be a positive whole number, not {context_tokens!r}")
    per_element = dtype_bytes(model.dtype)
    per_token = KV_TENSORS * model.layers * model.kv_heads * model.head_dim * per_element
    per_sequence = per_token * context_tokens
    if kv_budget_gb is not None:
        if gpu_memory_gb is not None or weights_gb is not None:
            raise PlanError("give either a KV budget, or GPU memory and weights, not both")
        _positive("KV budget (GiB)", kv_budget_gb)
        budget = int(_exact(kv_budget_gb) * GiB)
        gpus_used = memory = weights = None
    else:
        if gpu_memory_gb is None or weights_gb is None:
            raise PlanError("give a KV budget, or GPU memory and the weights' size")
        _positive("GPU memory (GiB)", gpu_memory_gb)
        if not isinstance(gpus, int) or gpus <= 0:
            raise PlanError(f"GPUs must be a positive whole number, not {gpus!r}")
        if not weights_gb >= 0 or math.isinf(weights_gb):
            raise PlanError(f"weights (GiB) must be zero or more, not {weights_gb}")
        memory, weights = int(_exact(gpu_memory_gb) * GiB), int(_exact(weights_gb) * GiB)
        gpus_used, budget = gpus, gpus * memory - weights
        if budget <= 0:
            raise PlanError(f"the weights ({weights_gb:g} GiB) fill the {gpus} × {gpu_memory_gb:g} GiB of GPU memory: "
                            "no room is left for the KV cache")
    return KvPlan(layers=model.layers, kv_heads=model.kv_heads, head_dim=model.head_dim, dtype=model.dtype,
                  dtype_bytes=per_element, bytes_per_token=per_token, context_tokens=context_tokens,
                  bytes_per_sequence=per_sequence, gpus=gpus_used, gpu_memory_bytes=memory, weights_bytes=weights,
                  kv_budget_bytes=budget, sequences_exact=budget / per_sequence,
                  concurrent_sequences=budget // per_sequence, kv_tokens=budget // per_token)


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """Replicas for a peak rate, with the check after `failures` are lost, and the cost."""

    peak_requests_per_s: float
    output_tokens_per_request: float
    demand_tokens_per_s: float
    per_replica_tokens_per_s: float  # measured goodput at the SLO
    ceiling: float  # the share of that goodput a replica may be planned to run at
    usable_tokens_per_replica: float  # per replica × ceiling
    floor_replicas: int  # throughput alone, every replica at 100 %
    ceiling_replicas: int  # every replica at the ceiling
    failures: int
    survivors_at_ceiling_plan: int  # ceiling_replicas − failures
    survivors_tokens_per_s: float  # what they serve at the ceiling
    ceiling_plan_survives: bool
    replicas: int  # the plan: the fewest that still serve the peak at the ceiling after the losses
    survivors: int
    survivors_capacity_tokens_per_s: float
    utilization_at_peak: float  # of measured goodput, all replicas up
    utilization_after_failures: float | None  # None when no replica survives (failures ≥ replicas)
    price_per_replica_hour: float | None
    hours_per_month: int
    monthly_cost: float | None


def replica_plan(*, peak_requests_per_s: float, output_tokens_per_request: float, per_replica_tokens_per_s: float,
                 ceiling: float = 0.7, failures: int = 1, price_per_replica_hour: float | None = None) -> ReplicaPlan:
    _positive("peak requests/s", peak_requests_per_s)
    _positive("output tokens per request", output_tokens_per_request)
    _positive("per-replica output tokens/s", per_replica_tokens_per_s)
    if not 0 < ceiling <= 1:
        raise PlanError(f"the utilization ceiling must be above 0 and at most 1, not {ceiling}")
    if not isinstance(failures, int) or failures < 0:
        raise PlanError(f"failures must be a whole number, zero or more, not {failures!r}")
    if price_per_replica_hour is not None and (not price_per_replica_hour >= 0 or math.isinf(price_per_replica_hour)):
        raise PlanError(f"the price per replica-hour must be zero or more, not {price_per_replica_hour}")
    demand = _exact(peak_requests_per_s) * _exact(output_tokens_per_request)
    per_replica = _exact(per_replica_tokens_per_s)
    usable = per_replica * _exact(ceiling)
    floor_replicas = math.ceil(demand / per_replica)
    ceiling_replicas = math.ceil(demand / usable)
    survivors_then = max(ceiling_replicas - failures, 0)
    survivors_serve = survivors_then * usable
    # The fewest replicas whose survivors still serve the peak at the ceiling: since
    # ceiling_replicas is the fewest that serve it with none lost, that is it plus the losses.
    replicas = ceiling_replicas + failures
    survivors = replicas - failures
    cost = None
    if price_per_replica_hour is not None:
        cost = float(replicas * HOURS_PER_MONTH * _exact(price_per_replica_hour))
    return ReplicaPlan(
        peak_requests_per_s=peak_requests_per_s, output_tokens_per_request=output_tokens_per_request,
        demand_tokens_per_s=float(demand), per_replica_tokens_per_s=per_replica_tokens_per_s, ceiling=ceiling,
        usable_tokens_per_replica=float(usable), floor_replicas=floor_replicas, ceiling_replicas=ceiling_replicas,
        failures=failures, survivors_at_ceiling_plan=survivors_then, survivors_tokens_per_s=float(survivors_serve),
        ceiling_plan_survives=survivors_serve >= demand, replicas=replicas, survivors=survivors,
        survivors_capacity_tokens_per_s=float(survivors * usable),
        utilization_at_peak=float(demand / (replicas * per_replica)),
        utilization_after_failures=float(demand / (survivors * per_replica)) if survivors else None,
        price_per_replica_hour=price_per_replica_hour, hours_per_month=HOURS_PER_MONTH, monthly_cost=cost)
