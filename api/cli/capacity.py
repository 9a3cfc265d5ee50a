"""`ledgerlm capacity plan`: how many sequences fit in a replica's KV cache, how many
replicas serve a peak rate at a utilization ceiling with a failure reserve, and what they
cost a month, with the working shown (or as JSON with `--json`):

    ledgerlm capacity plan --layers 80 --kv-heads 8 --head-dim 128 --dtype fp16 \\
        --context-tokens 4000 --gpu-memory-gb 80 --gpus 2 --weights-gb 140 \\
        --peak-rps 100 --output-tokens 300 --per-replica-tokens-per-s 2500 \\
        --price-per-replica-hour 3

The model's shape comes from `--model-dir` (its config.json) or explicit numbers; the
per-replica figure from `--from-loadtest FILE` (a `ledgerlm loadtest` result) or a number;
a load test that never saturated the service is refused unless `--allow-unsaturated`.
Memory is in GiB (2^30 bytes), as the engine reads `LEDGERLM_KV_CACHE_GB`; the `-gb` flags
keep their names and take GiB. Bad input is refused with a message and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

from models.capacity_inputs import MeasuredGoodput, measured_goodput, model_shape_from_config
from models.capacity_plan import GiB, KvPlan, ModelShape, PlanError, ReplicaPlan, kv_plan, replica_plan
from models.settings import Settings

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise PlanError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise PlanError(f"the {what} {path} is not JSON: {exc}") from None


def _model_home(path: Path) -> Path:
    """The model directory, given it or its config.json."""
    return path.parent if path.name == "config.json" else path


def read_model_dir(directory: Path, *, dtype: str | None = None) -> ModelShape:
    config = _model_home(directory) / "config.json"
    return model_shape_from_config(_read_json(config, "model config"), dtype=dtype)


def weights_gb_of(directory: Path) -> float:
    """The size of a model directory's weight files, the first kind of them found."""
    directory = _model_home(directory)
    for pattern in WEIGHT_PATTERNS:
        files = sorted(directory.glob(pattern))
        if files:
            return sum(f.stat().st_size for f in files) / GiB
    raise PlanError(f"{directory} holds no weight files ({', '.join(WEIGHT_PATTERNS)}): give --weights-gb")


def read_loadtest(path: Path, *, allow_unsaturated: bool = False) -> MeasuredGoodput:
    """The measured goodput; one of a test that never saturated the service is refused
    unless `allow_unsaturated` (then the caller warns)."""
    try:
        measured = measured_goodput(_read_json(path, "load test result"))
    except PlanError as exc:
        raise PlanError(f"{path}: {exc}") from None
    if measured.unsaturated and not allow_unsaturated:
        raise PlanError(f"{path}: {measured.unsaturated}. Sweep on to higher rates or concurrencies, "
                        "or give --allow-unsaturated to plan from it anyway")
    return measured


def _model(args: argparse.Namespace) -> ModelShape | None:
    explicit = {"layers": args.layers, "kv_heads": args.kv_heads, "head_dim": args.head_dim}
    if args.model_dir is not None:
        if any(v is not None for v in explicit.values()):
            raise PlanError("give either --model-dir or --layers/--kv-heads/--head-dim, not both")
        return read_model_dir(args.model_dir, dtype=args.dtype)
    if all(v is None for v in explicit.values()):
        return None
    missing = [f"--{k.replace('_', '-')}" for k, v in explicit.items() if v is None]
    if missing:
        raise PlanError(f"the model's shape needs {', '.join(missing)} too (or --model-dir)")
    return ModelShape(**explicit, dtype=args.dtype or "float16")


def plan(args: argparse.Namespace) -> dict:
    """The plan as a dict of its parts: `kv` (KvPlan), `replicas` (ReplicaPlan),
    `measured` (MeasuredGoodput, when read from a load test), `weights_from_dir`."""
    out: dict = {"kv": None, "replicas": None, "measured": None, "loadtest_file": None, "weights_from_dir": False,
                 "warnings": []}
    model = _model(args)
    if model is not None:
        if args.context_tokens is None:
            raise PlanError("the KV cache plan needs --context-tokens")
        weights = args.weights_gb
        if weights is None and args.kv_budget_gb is None and args.model_dir is not None \
                and args.gpu_memory_gb is not None:
            weights, out["weights_from_dir"] = weights_gb_of(args.model_dir), True
        out["kv"] = kv_plan(model, context_tokens=args.context_tokens, gpu_memory_gb=args.gpu_memory_gb,
                            gpus=args.gpus, weights_gb=weights, kv_budget_gb=args.kv_budget_gb)
    if args.peak_rps is not None:
        if args.output_tokens is None:
            raise PlanError("the replica plan needs --output-tokens (output tokens per request)")
        if (args.per_replica_tokens_per_s is None) == (args.from_loadtest is None):
            raise PlanError("give the per-replica goodput: --per-replica-tokens-per-s or --from-loadtest FILE")
        per_replica = args.per_replica_tokens_per_s
        if args.from_loadtest is not None:
            out["measured"] = read_loadtest(args.from_loadtest, allow_unsaturated=args.allow_unsaturated)
            out["loadtest_file"], per_replica = str(args.from_loadtest), out["measured"].per_replica_tokens_per_s
            if out["measured"].unsaturated:
                out["warnings"].append(f"{args.from_loadtest}: {out['measured'].unsaturated}")
        out["replicas"] = replica_plan(
            peak_requests_per_s=args.peak_rps, output_tokens_per_request=args.output_tokens,
            per_replica_tokens_per_s=per_replica, ceiling=args.ceiling, failures=args.failures,
            price_per_replica_hour=args.price_per_replica_hour)
    if out["kv"] is None and out["replicas"] is None:
        raise PlanError("nothing to plan: give a model (--model-dir or --layers/--kv-heads/--head-dim) with "
                        "--context-tokens, and/or --peak-rps with --output-tokens and a per-replica goodput")
    return out


def num(value: float, places: int = 2) -> str:
    """1,234 for whole numbers, 17.14 otherwise, and three significant digits below 1."""
    if abs(value - round(value)) < 1e-9:
        return f"{round(value):,}"
    if places and abs(value) < 1:
        places = max(places, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{places}f}".rstrip("0").rstrip(".")


def money(value: float) -> str:
    return f"${num(value)}" if abs(value - round(value)) < 1e-9 else f"${value:,.2f}"


def _label(text: str) -> str:
    """A line's label, padded so the figures line up."""
    return f"  {text + ':':<14}"


def _gb(nbytes: int) -> str:
    """Bytes in binary units, GiB unless that would round a figure away."""
    for unit, size in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size / 10:
            return f"{num(nbytes / size)} {unit}"
    return f"{nbytes:,} bytes"


def kv_lines(kv: KvPlan, weights_from_dir: bool) -> list[str]:
    lines = ["KV cache per replica (GiB = 2^30 bytes)",
             f"  per token:    2 × {kv.layers} layers × {kv.kv_heads} KV heads × {kv.head_dim} head dim × "
             f"{kv.dtype_bytes} bytes ({kv.dtype}) = {kv.bytes_per_token:,} bytes "
             f"({num(kv.bytes_per_token / 1024)} KiB)",
             f"  per sequence: {kv.bytes_per_token:,} bytes × {kv.context_tokens:,} tokens = "
             f"{_gb(kv.bytes_per_sequence)}"]
    if kv.gpus is None:
        lines.append(f"  KV budget:    {_gb(kv.kv_budget_bytes)} (given)")
    else:
        source = " (the model directory's weight files)" if weights_from_dir else ""
        lines.append(f"  KV budget:    {kv.gpus} GPU{'s' if kv.gpus > 1 else ''} × {_gb(kv.gpu_memory_bytes)} − "
                     f"{_gb(kv.weights_bytes)} of weights{source} = {_gb(kv.kv_budget_bytes)}")
    lines.append(f"  sequences:    {_gb(kv.kv_budget_bytes)} ÷ {_gb(kv.bytes_per_sequence)} = "
                 f"{num(kv.sequences_exact)}, so {kv.concurrent_sequences:,} concurrent sequences of "
                 f"{kv.context_tokens:,} tokens ({kv.kv_tokens:,} tokens in all)")
    if kv.concurrent_sequences == 0:
        lines.append("  warning:      not one full-length sequence fits: shorten the context or add memory")
    return lines


def _per_replica_line(r: ReplicaPlan, measured: MeasuredGoodput | None, file: str | None) -> list[str]:
    if measured is None:
        return [f"  per replica:  {num(r.per_replica_tokens_per_s)} output tokens/s at the SLO (given)"]
    m = measured
    slo = ", ".join(f"{k} ≤ {v:g}" for k, v in m.slo.items() if isinstance(v, (int, float))) or "no SLO recorded"
    lines = [f"  measured:     {num(m.goodput_output_tokens_per_s)} output tokens/s goodput ({slo}) in {file},",
             f"                step {m.step} of {m.steps} ({m.load()}), the best of {m.steps_meeting_slo} "
             f"that met the SLO, on {m.replicas} replica{'s' if m.replicas > 1 else ''}",
             f"  per replica:  {num(m.goodput_output_tokens_per_s)} ÷ {m.replicas} = "
             f"{num(r.per_replica_tokens_per_s)} output tokens/s at the SLO"]
    if m.unsaturated:
        lines.append("  unsaturated:  the test never saturated the service: a replica may serve more than this")
    return lines


def replica_lines(r: ReplicaPlan, measured: MeasuredGoodput | None, file: str | None) -> list[str]:
    pct = f"{num(r.ceiling * 100)} %"
    lines = ["Replicas",
             f"  peak demand:  {num(r.peak_requests_per_s)} requests/s × {num(r.output_tokens_per_request)} output "
             f"tokens = {num(r.demand_tokens_per_s)} output tokens/s",
             *_per_replica_line(r, measured, file),
             f"  floor:        {num(r.demand_tokens_per_s)} ÷ {num(r.per_replica_tokens_per_s)} = "
             f"{num(r.demand_tokens_per_s / r.per_replica_tokens_per_s)}, so {r.floor_replicas} replicas at 100 %",
             f"{_label('at ' + pct)}{num(r.demand_tokens_per_s)} ÷ "
             f"({num(r.per_replica_tokens_per_s)} × {r.ceiling:g} = {num(r.usable_tokens_per_replica)}) = "
             f"{num(r.demand_tokens_per_s / r.usable_tokens_per_replica)}, so {r.ceiling_replicas} replicas"]
    lost = f"{r.failures} lost"
    lead = _label(lost)
    if r.failures == 0:
        lines.append(f"{lead}none reserved: {r.ceiling_replicas} replicas")
    else:
        lines.append(f"{lead}{r.survivors_at_ceiling_plan} × {num(r.per_replica_tokens_per_s)} × {r.ceiling:g} = "
                     f"{num(r.survivors_tokens_per_s)} < {num(r.demand_tokens_per_s)}, so "
                     f"{r.ceiling_replicas} + {r.failures} = {r.replicas} replicas")
        lines.append(f"  check:        {r.survivors} × {num(r.per_replica_tokens_per_s)} × {r.ceiling:g} = "
                     f"{num(r.survivors_capacity_tokens_per_s)} ≥ {num(r.demand_tokens_per_s)}")
    after = "" if r.failures == 0 or r.utilization_after_failures is None else \
        f"; {num(r.utilization_after_failures * 100, 0)} % with {r.failures} lost"
    lines.append(f"  plan:         {r.replicas} replicas ({num(r.utilization_at_peak * 100, 0)} % of their goodput "
                 f"at peak{after})")
    if r.monthly_cost is not None:
        lines += ["", "Cost",
                  f"  {r.replicas} replicas × {r.hours_per_month} h × {money(r.price_per_replica_hour)} per "
                  f"replica-hour = {money(r.monthly_cost)} a month"]
    return lines


def working(out: dict) -> str:
    """The plan in plain words, one figure a line with how it was reached."""
    parts = []
    if out["kv"] is not None:
        parts.append("\n".join(kv_lines(out["kv"], out["weights_from_dir"])))
    if out["replicas"] is not None:
        parts.append("\n".join(replica_lines(out["replicas"], out["measured"], out["loadtest_file"])))
    return "\n\n".join(parts)


def as_json(out: dict) -> str:
    source = None
    if out["replicas"] is not None:
        source = "given" if out["measured"] is None else {"loadtest_file": out["loadtest_file"],
                                                         **asdict(out["measured"])}
    doc = {"units": {"GiB": GiB, "hours_per_month": 730},
           "kv": asdict(out["kv"]) if out["kv"] else None,
           "replicas": asdict(out["replicas"]) if out["replicas"] else None,
           "per_replica_source": source, "weights_from_dir": out["weights_from_dir"]}
    return json.dumps(doc, indent=2, ensure_ascii=False)


def _capacity(_: Settings, args: argparse.Namespace) -> int:
    try:
        out = plan(args)
    except PlanError as exc:
        print(f"ledgerlm capacity plan: error: {exc}", file=sys.stderr)
        return 2
    for warning in out["warnings"]:
        print(f"ledgerlm capacity plan: warning: {warning}", file=sys.stderr, flush=True)
    print(as_json(out) if args.json else working(out), flush=True)
    return 0


def _typed(kind, test, words: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"must be {words}, not {text}")
        return value
    return parse


positive = _typed(float, lambda v: 0 < v < float("inf"), "a positive number")
positive_int = _typed(int, lambda v: v > 0, "a positive whole number")
non_negative = _typed(float, lambda v: 0 <= v < float("inf"), "zero or more")
non_negative_int = _typed(int, lambda v: v >= 0, "a whole number, zero or more")


def _share(text: str) -> float:
    """0.7, or 70%."""
    percent = text.endswith("%")
    value = _typed(float, lambda v: v > 0, "above 0")(text.removesuffix("%"))
    value = value / 100 if percent else value
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be at most 1 (or 100%), not {text}")
    return value


def register(verbs) -> dict:
    cap = verbs.add_parser("capacity", help="plan replicas, KV cache and cost from a model and a measured goodput",
                           description="Memory is in GiB (2^30 bytes), as the engine reads LEDGERLM_KV_CACHE_GB; "
                                       "the -gb flags take GiB. A month is 730 hours.")
    cap.add_argument("action", choices=["plan"], help="plan: the working, figure by figure")
    cap.add_argument("--json", action="store_true", help="every figure of the plan as JSON")
    model = cap.add_argument_group("model (for the KV cache)")
    model.add_argument("--model-dir", metavar="DIR", type=Path,
                       help="a Hugging Face model directory (its config.json)")
    model.add_argument("--layers", metavar="N", type=positive_int, help="hidden layers")
    model.add_argument("--kv-heads", metavar="N", type=positive_int, help="key/value heads")
    model.add_argument("--head-dim", metavar="N", type=positive_int, help="dimension of one head")
    model.add_argument("--dtype", metavar="DTYPE", help="KV cache dtype: fp16, bf16, fp32, fp8 ... "
                       "(default: the config's, or float16 with explicit numbers)")
    model.add_argument("--context-tokens", metavar="TOKENS", type=positive_int,
                       help="tokens of one sequence (prompt and output)")
    memory = cap.add_argument_group("memory of one replica")
    memory.add_argument("--gpu-memory-gb", "--gpu-memory-gib", dest="gpu_memory_gb", metavar="GiB", type=positive,
                        help="memory of one GPU, GiB (an 80 GB GPU: 80)")
    memory.add_argument("--gpus", metavar="N", type=positive_int, default=1, help="GPUs per replica (default 1)")
    memory.add_argument("--weights-gb", "--weights-gib", dest="weights_gb", metavar="GiB", type=non_negative,
                        help="the weights' size, GiB (default: the model directory's weight files)")
    memory.add_argument("--kv-budget-gb", "--kv-budget-gib", dest="kv_budget_gb", metavar="GiB", type=positive,
                        help="the KV cache budget outright, GiB (the engine's LEDGERLM_KV_CACHE_GB)")
    load = cap.add_argument_group("load and throughput")
    load.add_argument("--peak-rps", metavar="RPS", type=positive, help="peak requests per second")
    load.add_argument("--output-tokens", metavar="TOKENS", type=positive, help="output tokens per request")
    load.add_argument("--per-replica-tokens-per-s", metavar="TOKENS_PER_S", type=positive,
                      help="measured output tokens/s of one replica at the SLO (goodput)")
    load.add_argument("--from-loadtest", type=Path, metavar="FILE",
                      help="a `ledgerlm loadtest` result: its best goodput at the SLO, per replica")
    load.add_argument("--allow-unsaturated", action="store_true",
                      help="plan from a load test that never saturated the service (its best step its last, no "
                           "SLO broken), with a warning: the plan then overstates the replicas")
    load.add_argument("--ceiling", metavar="SHARE", type=_share, default=0.7,
                      help="plan each replica at this share of its goodput (default 0.7)")
    load.add_argument("--failures", metavar="N", type=non_negative_int, default=1,
                      help="replicas the plan must survive losing (default 1)")
    load.add_argument("--price-per-replica-hour", metavar="DOLLARS", type=non_negative,
                      help="price of one replica-hour, dollars")
    return {"capacity": _capacity}
