"""Which revision a router alias sends a request to, and why (pure).

Rules are tried in order; the first that applies chooses. A static rule applies when its
match fields hold (tenant, application, endpoint, a request tag) and names its revision.
A dynamic rule applies when they hold and the eval table has scores for its task among
its revisions: it picks the cheapest revision whose score clears the bar. Its task is
looked up per difficulty band first (`task/hard` or `task/easy`, by input length and
marker words, thresholds the admin sets with the eval data), then as `task`. When no rule
applies, the alias's own revision serves ("default"). Every decision names its rule, and
is pinned on `GenerationRequested`, so a replay sees the same choice.
"""
from __future__ import annotations

from dataclasses import dataclass

from models.events_admin import RouteRule

DEFAULT_RULE = "default"


@dataclass(frozen=True)
class RouteAsk:
    tenant_id: str
    application_id: str
    endpoint: str
    tag: str | None
    input_tokens: int
    text: str


@dataclass(frozen=True)
class Choice:
    revision: str
    rule: str
    band: str | None = None  # a dynamic rule's difficulty band


def band(rule: RouteRule, ask: RouteAsk) -> str:
    lowered = ask.text.lower()
    hard = (rule.hard_input_tokens is not None and ask.input_tokens >= rule.hard_input_tokens) or any(
        word.lower() in lowered for word in rule.hard_words)
    return "hard" if hard else "easy"


def matches(rule: RouteRule, ask: RouteAsk) -> bool:
    return all(want is None or want == have for want, have in (
        (rule.tenant, ask.tenant_id), (rule.application, ask.application_id), (rule.endpoint, ask.endpoint),
        (rule.tag, ask.tag)))


def price(revision) -> int:
    """What a revision costs, to rank by: output price first (most of a generation), then input."""
    return revision.price_output_per_1k_micros * 4 + revision.price_input_per_1k_micros


def choose(registry, rules: tuple[RouteRule, ...], default: str, ask: RouteAsk) -> Choice:
    for rule in rules:
        if not matches(rule, ask):
            continue
        if rule.revision is not None:
            if registry.pinnable(rule.revision) is not None:
                return Choice(rule.revision, rule.name)
            continue
        if rule.task is None:
            continue
        level = band(rule, ask)
        for task in (f"{rule.task}/{level}", rule.task):
            scores = registry.evals.get(task, {})
            known = [r for r in rule.revisions if r in scores and registry.pinnable(r) is not None]
            if not known:
                continue
            passing = [r for r in known if rule.bar is None or scores[r].score >= rule.bar]
            if passing:
                best = min(passing, key=lambda r: (price(registry.revisions[r]), r))
                return Choice(best, rule.name, level)
            break  # scored, and none clears the bar: this rule does not apply
    return Choice(default, DEFAULT_RULE)
