"""The batch pool's engine: vLLM's offline `LLM`, which schedules a whole chunk at once
(the throughput path), with the interactive adapter's engine config so a batch runs on
the same pinned model revision: the revision's recorded engine settings
(`models.engine_settings`) over the worker's capacity, as the interactive worker builds it. Prompts arrive as token ids (tokenized at validation),
and each carries the tenant as `cache_salt`, so prefix-cache blocks never cross tenants.

One engine per worker process, made on first use and kept warm across tasks; a task for
another model or config replaces it.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from pydantic import ValidationError

from models.engine_settings import EngineSettings, detect_device
from pipelines import artifacts
from pipelines.log_level import engine_logging
from workers.engine import EngineMismatch
from workers.engine_config import VllmEngineConfig, engine_config_hash

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenRequest:
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass(frozen=True)
class GenResult:
    text: str
    token_ids: list[int]
    finish_reason: str | None
    prompt_tokens: int
    error: str | None = None  # set when this one request was refused by the engine


class BatchEngine(Protocol):
    def generate(self, requests: list[GenRequest], *, tenant_id: str) -> list[GenResult]: ...

    def close(self) -> None: ...


class VllmBatchEngine:
    def __init__(self, config: VllmEngineConfig):
        # In-process engine core: a Celery child killed mid-chunk then leaves no orphaned
        # EngineCore process behind, and the offline path loses nothing by it.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        engine_logging()  # vLLM's loggers at LEDGERLM_LOG_LEVEL
        from vllm import LLM

        self.config = config
        self._llm = LLM(**config.engine_args())

    def _params(self, r: GenRequest):
        from vllm import SamplingParams

        return SamplingParams(max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p, seed=r.seed,
                              stop=r.stop or None, ignore_eos=r.ignore_eos)

    def generate(self, requests: list[GenRequest], *, tenant_id: str) -> list[GenResult]:
        if not requests:
            return []
        prompts = [{"prompt_token_ids": list(r.prompt_token_ids), "cache_salt": tenant_id} for r in requests]
        try:
            outputs = self._llm.generate(prompts, [self._params(r) for r in requests], use_tqdm=False)
        except ValueError:
            if len(requests) == 1:
                raise
            # One bad request refuses the whole call; run them one by one to fail only it.
            return [self._one(p, r, tenant_id) for p, r in zip(prompts, requests)]
        return [_result(o) for o in outputs]

    def _one(self, prompt: dict, request: GenRequest, tenant_id: str) -> GenResult:
        try:
            (output,) = self._llm.generate([prompt], [self._params(request)], use_tqdm=False)
        except ValueError as exc:
            return GenResult("", [], None, len(request.prompt_token_ids), error=str(exc))
        return _result(output)

    def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if shutdown is not None:
                shutdown()


def _result(output) -> GenResult:
    completion = output.outputs[0]
    return GenResult(completion.text, list(completion.token_ids), completion.finish_reason,
                     len(output.prompt_token_ids or []))


def batch_config(*, model_path: str, max_model_len: int, capacity: dict,
                 engine_settings: EngineSettings | None = None) -> VllmEngineConfig:
    """The engine a chunk runs on: the revision's recorded `engine_settings` over the worker's
    `capacity`, as `VllmEngine.from_settings` builds the interactive one (a KV cache the
    revision leaves open is the worker's on CPU, vLLM's on a GPU). A revision approved
    before settings were recorded has none: the defaults, as before."""
    chosen = engine_settings.model_dump() if engine_settings else {}
    if chosen.get("kv_cache_gb", 0) is None and detect_device().kind == "cpu":
        del chosen["kv_cache_gb"]
    return VllmEngineConfig(model=Path(model_path), max_model_len=max_model_len, **{**capacity, **chosen})


def recorded_settings(given: EngineSettings | dict | None) -> EngineSettings | None:
    """A chunk task's engine settings (a dict, as queued) as `EngineSettings`; ones this
    worker cannot read are an `EngineMismatch`, since it could not build that engine."""
    if given is None or isinstance(given, EngineSettings):
        return given
    try:
        return EngineSettings.model_validate(given)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "engine_settings"
        raise EngineMismatch(f"the revision's engine settings are not ones this worker can build "
                             f"({where}: {first['msg']})") from None


@dataclass
class EngineSlot:
    """The worker process's one engine, keyed by what it was made for."""

    capacity: dict  # max_num_seqs and kv_cache_gb from settings: they do not change outputs
    engine: BatchEngine | None = None
    key: tuple | None = None
    factory: type = VllmBatchEngine

    def get(self, *, model_path: str, max_model_len: int, pinned_hash: str, artifact_manifest: str | None = None,
            engine_settings: EngineSettings | dict | None = None, on_starting: Callable[[], None] = lambda: None,
            on_started: Callable[[float], None] = lambda seconds: None) -> BatchEngine:
        """The warm engine, or a new one built with the revision's `engine_settings`:
        `on_starting` is called right before one is made, `on_started` with the seconds it
        took once it is up."""
        settings = recorded_settings(engine_settings)
        key = (model_path, max_model_len, pinned_hash, artifact_manifest, settings)
        if self.engine is not None and self.key == key:
            return self.engine
        config = batch_config(model_path=model_path, max_model_len=max_model_len, capacity=self.capacity,
                              engine_settings=settings)
        actual = engine_config_hash(config)
        if actual != pinned_hash:
            raise EngineMismatch(f"this worker's engine config ({config.dtype}, enforce_eager={config.enforce_eager}) "
                                 f"hashes to {actual}, but the batch pinned {pinned_hash}: the outputs would not "
                                 f"be that revision's")
        if artifact_manifest is not None:
            try:
                found = artifacts.manifest_digest(artifacts.artifact_digests(Path(model_path)))
            except artifacts.ArtifactError as exc:
                raise EngineMismatch(str(exc)) from None
            if found != artifact_manifest:
                raise EngineMismatch(f"the files in {model_path} are not the ones the revision was approved with "
                                     f"(manifest {found[:12]}, approved {artifact_manifest[:12]})")
        self.drop()
        logger.info("starting the batch engine for %s", model_path)
        on_starting()
        began = time.monotonic()
        self.engine, self.key = self.factory(config), key
        on_started(time.monotonic() - began)
        return self.engine

    def drop(self) -> None:
        """Forgets the engine (after an error mid-generate, its state is not trusted)."""
        engine, self.engine, self.key = self.engine, None, None
        if engine is not None:
            try:
                engine.close()
            except Exception:  # closing a broken engine may fail too; it is dropped either way
                logger.exception("closing the batch engine failed")
