"""Semantic cache figures: lookup latency at 10k and 100k entries in one tenant's partition,
the embedding time of one prompt, and hit and false-hit rates on the paraphrase set
(`tests/perf/paraphrases.jsonl`, how it was built in `paraphrases.md`) at a few thresholds.
`--set` takes another set of the same format, such as the held-out
`tests/perf/paraphrases_heldout.jsonl` (`paraphrases_heldout.md`).

    .venv/bin/python -m tests.perf.bench_semantic_cache [--home DIR] [--sizes 10000,100000] [--set PATH]

Lookups search vectors inserted directly (random unit vectors of the embedder's width), so
the figure is the index's and the cache's bookkeeping, not the embedder's; the embedding
time is measured on its own. The false-hit rate's 95 % upper bound is the exact
(Clopper-Pearson) one. Prints one JSON object and appends a table of it, naming the set, to
the "Semantic cache" section of tests/perf/RESULTS.md (`--no-record` to skip).
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipelines.cache.key_terms import agree
from pipelines.cache.semantic import SemanticCache
from pipelines.cache.similarity import Embedder, model_dir
from tests.perf.results import record_run

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
# As a whole line: `append_entry` finds a section by substring, and the summary's
# "### Semantic cache: ..." would match "## Semantic cache" first.
SECTION = "## Semantic cache"
THRESHOLDS = (0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.96)


def quantiles(values: list[float]) -> dict:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]  # noqa: E731
    return {"p50_ms": round(pick(0.50) * 1000, 3), "p99_ms": round(pick(0.99) * 1000, 3)}


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The exact one-sided upper bound on a binomial rate after k of n (Clopper-Pearson)."""
    if k >= n:
        return 1.0
    alpha = 1 - confidence

    def cdf(p: float) -> float:
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))

    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > alpha else (lo, mid)
    return hi


class _Unused:
    dim = 384

    def embed(self, texts):
        raise AssertionError("lookups here pass their vectors")


def lookup_latency(size: int, dim: int = 384, probes: int = 2000) -> dict:
    rng = np.random.default_rng(size)
    vectors = rng.normal(size=(size, dim)).astype("float32")
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    cache = SemanticCache(_Unused(), max_entries_per_tenant=size)
    started = time.perf_counter()
    for i, v in enumerate(vectors):
        cache.insert(tenant_id="acme", alias="chat", partition="p", prompt="", answer="a", output_tokens=1,
                     input_tokens=1, finish_reason="stop", ttl_s=3600, vector=v)
    inserted_s = time.perf_counter() - started
    times, hits = [], 0
    for i in range(probes):
        probe = vectors[rng.integers(size)] + rng.normal(scale=0.01, size=dim).astype("float32")
        probe /= np.linalg.norm(probe)
        t0 = time.perf_counter()
        found = cache.lookup(partition="p", prompt="", vector=probe)
        times.append(time.perf_counter() - t0)
        hits += found.entry is not None
    return {"entries": size, "insert_all_s": round(inserted_s, 2), **quantiles(times), "probes": probes,
            "near_duplicate_hits": hits}


def paraphrase_rates(embedder, rows: list[dict]) -> dict:
    """Hit and false-hit rates per threshold, as the cache decides (similarity at least the
    threshold and the key terms agreeing, `pipelines.cache.key_terms`) and by similarity alone."""
    anchors = embedder.embed([r["anchor"] for r in rows])
    probes = embedder.embed([r["probe"] for r in rows])
    sims = [float(np.dot(a, b)) for a, b in zip(anchors, probes)]
    agreed = [agree(r["anchor"], r["probe"]) for r in rows]
    paraphrase = [(s, ok) for s, ok, r in zip(sims, agreed, rows) if r["label"] == "paraphrase"]
    negatives = [(s, ok, r["kind"]) for s, ok, r in zip(sims, agreed, rows) if r["label"] == "hard_negative"]
    kinds = sorted({k for *_, k in negatives})
    out = {"paraphrases": len(paraphrase), "hard_negatives": len(negatives), "by_threshold": []}
    for t in THRESHOLDS:
        false = sum(s >= t and ok for s, ok, _ in negatives)
        false_alone = sum(s >= t for s, _, _ in negatives)
        out["by_threshold"].append({
            "threshold": t, "hit_rate": round(sum(s >= t and ok for s, ok in paraphrase) / len(paraphrase), 3),
            "false_hit_rate": round(false / len(negatives), 4),
            "false_hit_upper_95": round(upper_bound(false, len(negatives)), 4),
            "false_hits_by_kind": {k: sum(s >= t and ok for s, ok, kk in negatives if kk == k) for k in kinds},
            "similarity_alone": {"hit_rate": round(sum(s >= t for s, _ in paraphrase) / len(paraphrase), 3),
                                 "false_hit_rate": round(false_alone / len(negatives), 4)}})
    out["median_similarity"] = {"paraphrase": round(statistics.median(s for s, _ in paraphrase), 3),
                                "hard_negative": round(statistics.median(s for s, _, _ in negatives), 3)}
    out["key_terms_disagree"] = {"paraphrases": sum(not ok for _, ok in paraphrase),
                                 "hard_negatives": sum(not ok for _, ok, _ in negatives)}
    return out


def embedding_latency(embedder, texts: list[str]) -> dict:
    embedder.embed(texts[:4])  # loaded and warm
    times = []
    for text in texts:
        t0 = time.perf_counter()
        embedder.embed([text])
        times.append(time.perf_counter() - t0)
    return {"prompts": len(texts), **quantiles(times)}


def shown(path: Path) -> str:
    """The set's path as the entry names it: relative to the repository where it is inside."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def table(result: dict) -> str:
    rates = result["paraphrase_set"]
    lines = [f"| threshold | paraphrases hit | false hits (of {rates['hard_negatives']}) | upper 95 % | "
             "false hits by kind | similarity alone: hit / false hit |", "|---:|---:|---:|---:|---|---:|"]
    for t in rates["by_threshold"]:
        false = round(t["false_hit_rate"] * rates["hard_negatives"])
        kinds = ", ".join(f"{k} {n}" for k, n in t["false_hits_by_kind"].items() if n) or "-"
        alone = t["similarity_alone"]
        lines.append(f"| {t['threshold']:.2f} | {t['hit_rate']:.1%} | {false} ({t['false_hit_rate']:.1%}) | "
                     f"{t['false_hit_upper_95']:.1%} | {kinds} | {alone['hit_rate']:.1%} / "
                     f"{alone['false_hit_rate']:.1%} |")
    median, disagree = rates["median_similarity"], rates["key_terms_disagree"]
    lines += ["", f"Median similarity: paraphrases {median['paraphrase']}, hard negatives {median['hard_negative']}. "
              f"Key terms disagree on {disagree['paraphrases']} of {rates['paraphrases']} paraphrases and "
              f"{disagree['hard_negatives']} of {rates['hard_negatives']} hard negatives."]
    emb = result["embedding"]
    lines.append(f"Embedding of one prompt: p50 {emb['p50_ms']} ms, p99 {emb['p99_ms']} ms.")
    for look in result["lookup"]:
        lines.append(f"Lookups, {look['entries']} entries: p50 {look['p50_ms']} ms, p99 {look['p99_ms']} ms "
                     f"({look['near_duplicate_hits']} of {look['probes']} noisy probes found).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path, default=None, help="where the MiniLM model is unpacked")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--set", type=Path, default=HERE / "paraphrases.jsonl", metavar="PATH",
                        help="the evaluation set, one JSON object a line (default: tests/perf/paraphrases.jsonl)")
    parser.add_argument("--no-record", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="ledgerlm-cache-bench-"))
    rows = [json.loads(line) for line in args.set.read_text().splitlines() if line.strip()]
    embedder = Embedder(model_dir(home))
    result = {
        "embedding": embedding_latency(embedder, [r["probe"] for r in rows][:200]),
        "paraphrase_set": paraphrase_rates(embedder, rows),
        "lookup": [lookup_latency(int(n)) for n in args.sizes.split(",")],
    }
    print(json.dumps(result, indent=1))
    if not args.no_record:
        rates = result["paraphrase_set"]
        record_run(SECTION, ".venv/bin/python -m tests.perf.bench_semantic_cache " + shlex.join(sys.argv[1:]),
                   f"Set `{shown(args.set)}` ({rates['paraphrases']} paraphrases, {rates['hard_negatives']} hard "
                   f"negatives); lookups at {args.sizes} entries", table(result), heading=f": set {shown(args.set)}")


if __name__ == "__main__":
    main()
