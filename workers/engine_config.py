"""The vLLM engine's configuration and its identity: `VllmEngineConfig` is what vLLM is
told to build, `engine_config_hash` the short hash that pins a model revision to the
settings that change its output (`models.engine_settings` says where they come from)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from models.engine_settings import engine_version

GiB = 1 << 30
_FULL_HASH_LIMIT = 64 << 20  # weight files above this are fingerprinted, not read whole
_EDGE_BYTES = 4 << 20


@dataclass(frozen=True)
class VllmEngineConfig:
    """The engine as vLLM is told to build it. The defaults are the CPU's; a revision's
    recorded settings (`models.engine_settings`) replace them (`VllmEngine.from_settings`)."""

    model: Path
    max_model_len: int = 512
    max_num_seqs: int = 16
    kv_cache_gb: float | None = 1.0  # None: vLLM sizes it from `gpu_memory_utilization`
    dtype: str = "float32"
    # No torch.compile: on CPU it costs minutes of start-up for a small model.
    enforce_eager: bool = True
    seed: int = 0
    shutdown_timeout_s: float = 30.0
    cpu_nice: int = 10  # added to the engine processes' nice value (0: leave them as they are)
    # vLLM's per-step stats (KV-cache usage, preemptions, step times) into `VllmEngine.stats`
    # for the worker's metrics; see `workers.engine_stats`.
    log_stats: bool = True
    tensor_parallel_size: int = 1
    quantization: str | None = None
    gpu_memory_utilization: float | None = None  # None: vLLM's default share
    max_num_batched_tokens: int | None = None  # the chunked-prefill budget; None: vLLM's

    def engine_args(self) -> dict[str, Any]:
        optional = {"kv_cache_memory_bytes": None if self.kv_cache_gb is None else int(self.kv_cache_gb * GiB),
                    "quantization": self.quantization, "gpu_memory_utilization": self.gpu_memory_utilization,
                    "max_num_batched_tokens": self.max_num_batched_tokens}
        return {
            "model": str(self.model),
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "dtype": self.dtype,
            "enforce_eager": self.enforce_eager,
            "tensor_parallel_size": self.tensor_parallel_size,
            "seed": self.seed,
            "enable_prefix_caching": True,
            "scheduling_policy": "priority",
            # Stats go to our own logger (`start`), never to vLLM's log lines.
            "disable_log_stats": True,
            "enable_logging_iteration_details": self.log_stats,  # step times
            **{key: value for key, value in optional.items() if value is not None},
        }


# Settings that only size capacity or run the process; everything else changes output.
_CAPACITY = {"model", "kv_cache_gb", "max_num_seqs", "shutdown_timeout_s", "cpu_nice", "log_stats",
             "gpu_memory_utilization", "max_num_batched_tokens"}
# Output settings added later, hashed only when set, so revisions approved before keep their hash.
_LATER = {"tensor_parallel_size": 1, "quantization": None}


def engine_config_hash(config: VllmEngineConfig, version: str | None = None) -> str:
    """12 hex digits over the model's files, the settings that change its output and the
    engine's version (`version`, the installed one by default): an engine upgrade is a new
    revision, rolled out as one. Capacity settings (KV cache size, GPU memory share,
    concurrency, the prefill chunk) are left out: they decide how much runs at once, not
    what a request gets. The model is hashed by content rather than path so the same model
    pins the same revision on every machine."""
    outputs = {key: value for key, value in asdict(config).items()
               if key not in _CAPACITY and not (key in _LATER and value == _LATER[key])}
    outputs["engine"] = version or engine_version()
    digest = hashlib.sha256(json.dumps(outputs, sort_keys=True).encode())
    digest.update(_model_fingerprint(Path(config.model)).encode())
    return digest.hexdigest()[:12]


def _model_fingerprint(model: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in model.iterdir() if p.is_file() and not p.name.startswith(".")):
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        with path.open("rb") as file:
            if size <= _FULL_HASH_LIMIT:
                digest.update(file.read())
            else:  # a fine-tune rewrites every tensor, so both ends of the file move
                digest.update(file.read(_EDGE_BYTES))
                file.seek(size - _EDGE_BYTES)
                digest.update(file.read(_EDGE_BYTES))
    return digest.hexdigest()
