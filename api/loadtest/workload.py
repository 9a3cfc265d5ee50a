"""What a load test sends: tenants and their shares, prompt and output lengths, arrivals,
streaming, cacheable repeats and the SLO, read from a YAML or JSON workload file.

Everything random comes from one seeded generator, so the same file and seed send the
same requests at the same offsets (two targets compared side by side get the same work).
"""
from __future__ import annotations

import csv
import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

# Short common words: about one token each for the usual BPE tokenizers, so a prompt of
# n words is about n tokens without loading a tokenizer.
_WORDS = ("the of and to in is it for on as at by be or an we he so no up do go my me if us am "
          "one two red sun sea cat dog box car map key pen cup hat bag day way end top log row").split()


class WorkloadError(ValueError):
    """The workload file says something this tool cannot do."""


@dataclass(frozen=True)
class Tenant:
    name: str
    api_key: str | None
    share: float
    key_env: str | None = None  # the variable the key was to come from, when the file names one


@dataclass
class Lengths:
    """A token-count distribution: fixed, uniform, lognormal (median and sigma; sigma near 1
    gives the fat tail real prompt lengths have), or replayed from a trace file in order."""

    dist: str = "fixed"
    value: int = 32
    min: int = 1
    max: int = 100_000
    median: float = 64.0
    sigma: float = 1.0
    trace: list[int] = field(default_factory=list)
    _next: int = 0

    def sample(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            n = self.value
        elif self.dist == "uniform":
            n = rng.randint(self.min, self.max)
        elif self.dist == "lognormal":
            n = round(rng.lognormvariate(math.log(self.median), self.sigma))
        else:  # trace: replayed in order, round and round
            n, self._next = self.trace[self._next % len(self.trace)], self._next + 1
        return max(self.min, min(self.max, n))


def read_trace(path: Path, column: str) -> list[int]:
    """One column of a trace: JSON lines or CSV with `prompt_tokens` / `output_tokens`."""
    text = path.read_text()
    if path.suffix == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    values = [int(row[column]) for row in rows if row.get(column) not in (None, "")]
    if not values:
        raise WorkloadError(f"trace {path} has no {column!r} values")
    return values


def lengths(spec: dict | int | None, column: str, base: Path, default: int) -> Lengths:
    if spec is None:
        return Lengths(value=default)
    if isinstance(spec, int):
        return Lengths(value=spec)
    dist = spec.get("dist", "fixed")
    if dist not in ("fixed", "uniform", "lognormal", "trace"):
        raise WorkloadError(f"unknown length distribution {dist!r}")
    out = Lengths(dist=dist, value=int(spec.get("value", default)), min=int(spec.get("min", 1)),
                  max=int(spec.get("max", 100_000)), median=float(spec.get("median", default)),
                  sigma=float(spec.get("sigma", 1.0)))
    if dist == "trace":
        out.trace = read_trace(base / spec["file"], spec.get("column", column))
    return out


@dataclass(frozen=True)
class Arrivals:
    """When requests are sent at a mean rate: Poisson (exponential gaps), gamma (gaps with
    coefficient of variation `cv`; above 1 they come in bursts) or a step burst (Poisson at
    the rate, `factor` times it from `burst_at_s` for `burst_s`)."""

    process: str = "poisson"
    cv: float = 1.0
    burst_at_s: float = 0.0
    burst_s: float = 0.0
    factor: float = 1.0

    def offsets(self, rate: float, duration_s: float, rng: random.Random) -> list[float]:
        """Send offsets (s from the step's start) for `duration_s` at `rate` per second."""
        out, t = [], 0.0
        while True:
            if self.process == "gamma":
                shape = 1.0 / (self.cv ** 2)
                t += rng.gammavariate(shape, 1.0 / (rate * shape))
            elif self.process == "step":
                in_burst = self.burst_at_s <= t < self.burst_at_s + self.burst_s
                t += rng.expovariate(rate * (self.factor if in_burst else 1.0))
            else:
                t += rng.expovariate(rate)
            if t >= duration_s:
                return out
            out.append(t)


@dataclass(frozen=True)
class Slo:
    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    # Rejected and failed requests are reported apart from latency; a step whose share of
    # them is above this does not meet the SLO, so shedding cannot pass for good service.
    max_unserved_share: float = 0.01

    def request_ok(self, ttft_ms: float | None, tpot_ms: float | None) -> bool:
        return ((self.ttft_p95_ms is None or (ttft_ms is not None and ttft_ms <= self.ttft_p95_ms))
                and (self.tpot_p95_ms is None or tpot_ms is None or tpot_ms <= self.tpot_p95_ms))

    def as_json(self) -> dict:
        return {"ttft_p95_ms": self.ttft_p95_ms, "tpot_p95_ms": self.tpot_p95_ms,
                "max_unserved_share": self.max_unserved_share}


@dataclass
class Mode:
    """fixed rate, fixed concurrency, or a sweep over rising rates or concurrencies."""

    kind: str = "rate"  # rate | concurrency | sweep
    rate: float | None = None
    concurrency: int | None = None
    rates: list[float] = field(default_factory=list)
    concurrencies: list[int] = field(default_factory=list)
    duration_s: float = 30.0
    min_gain: float = 0.05  # a sweep stops when throughput rose less than this over the best step


@dataclass
class Request:
    """One request to send: who, what, and how long an answer."""

    index: int
    tenant: Tenant
    prompt: str
    prompt_tokens: int
    max_tokens: int
    repeat: bool


@dataclass
class Workload:
    model: str
    tenants: list[Tenant]
    prompt_tokens: Lengths
    output_tokens: Lengths
    arrivals: Arrivals
    slo: Slo
    mode: Mode
    api: str = "chat"  # chat | completions
    stream: bool = True
    cacheable_repeat: float = 0.0
    extra_body: dict = field(default_factory=dict)
    seed: int = 0

    def requests(self, rng: random.Random):
        """An endless stream of requests drawn from the tenant mix and the distributions."""
        shares = [t.share for t in self.tenants]
        seen: dict[str, list[tuple[str, int]]] = {t.name: [] for t in self.tenants}
        index = 0
        while True:
            tenant = rng.choices(self.tenants, shares)[0]
            out = self.output_tokens.sample(rng)
            earlier = seen[tenant.name]
            if earlier and rng.random() < self.cacheable_repeat:
                prompt, n = rng.choice(earlier)
                yield Request(index, tenant, prompt, n, out, True)
            else:
                n = self.prompt_tokens.sample(rng)
                # A distinct head so two fresh prompts never share a cached prefix.
                prompt = f"r{index}-{rng.getrandbits(32):x} " + " ".join(rng.choice(_WORDS) for _ in range(n - 1))
                earlier.append((prompt, n))
                del earlier[:-64]  # repeats come from a tenant's recent prompts
                yield Request(index, tenant, prompt, n, out, False)
            index += 1


def _tenant(spec: dict, allow_missing_keys: bool) -> Tenant:
    key, env = spec.get("api_key"), spec.get("api_key_env")
    if key is None and env:
        key = os.environ.get(env)
        if key is None and not allow_missing_keys:
            raise WorkloadError(f"tenant {spec.get('name')!r}: ${env} is not set")
    return Tenant(name=str(spec["name"]), api_key=key, share=float(spec.get("share", 1.0)), key_env=env or None)


def missing_keys(workload: Workload) -> list[Tenant]:
    """The tenants whose key was to come from a variable that is not set."""
    return [t for t in workload.tenants if t.api_key is None and t.key_env]


def parse(data: dict, base: Path = Path("."), *, allow_missing_keys: bool = False) -> Workload:
    """With `allow_missing_keys`, a tenant whose `api_key_env` is not set is kept without a
    key (`missing_keys` lists them) for the caller to provide one."""
    try:
        return _parse(data, base, allow_missing_keys)
    except WorkloadError:
        raise
    except (TypeError, KeyError, ValueError) as exc:  # an unknown or missing key, a value of the wrong kind
        raise WorkloadError(f"workload: {exc!r}") from None


def _parse(data: dict, base: Path, allow_missing_keys: bool) -> Workload:
    tenants = [_tenant(t, allow_missing_keys) for t in data.get("tenants") or [{"name": "default"}]]
    if len({t.name for t in tenants}) != len(tenants) or any(t.share <= 0 for t in tenants):
        raise WorkloadError("tenants need distinct names and positive shares")
    arrival = dict(data.get("arrival") or {})
    if arrival.get("process", "poisson") not in ("poisson", "gamma", "step"):
        raise WorkloadError(f"unknown arrival process {arrival.get('process')!r}")
    mode = dict(data.get("mode") or {})
    if mode.get("kind", "rate") not in ("rate", "concurrency", "sweep"):
        raise WorkloadError(f"unknown mode {mode.get('kind')!r}")
    api = data.get("api", "chat")
    if api not in ("chat", "completions"):
        raise WorkloadError("api is chat or completions")
    return Workload(
        model=str(data.get("model", "")), tenants=tenants,
        prompt_tokens=lengths(data.get("prompt_tokens"), "prompt_tokens", base, 64),
        output_tokens=lengths(data.get("output_tokens"), "output_tokens", base, 32),
        arrivals=Arrivals(**arrival), slo=Slo(**(data.get("slo") or {})), mode=Mode(**mode), api=api,
        stream=bool(data.get("stream", True)), cacheable_repeat=float(data.get("cacheable_repeat", 0.0)),
        extra_body=dict(data.get("extra_body") or {"ignore_eos": True}), seed=int(data.get("seed", 0)))


def load(path: Path, *, allow_missing_keys: bool = False) -> Workload:
    import yaml  # YAML is a superset of JSON, so one reader does both

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise WorkloadError(f"cannot read the workload {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise WorkloadError(f"{path} is not YAML or JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}: a workload is a mapping")
    return parse(data, Path(path).parent, allow_missing_keys=allow_missing_keys)
