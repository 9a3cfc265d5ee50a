"""Router aliases (`models.router`): static rules by tenant, application, endpoint and tag;
a dynamic rule picks the cheapest revision whose eval score for the task (per difficulty
band) clears the bar, and stays out of the way without eval data; the eval table changes
the choice; nothing routes to a revision that cannot be pinned."""
from __future__ import annotations

from models.events import new_event
from models.events_admin import EvalRow, EvalScoresRecorded, ModelRevisionApproved, ModelRevisionRetired, RouteRule
from models.registry import Registry
from models.router import DEFAULT_RULE, RouteAsk, choose

BIG, SMALL, MID = "big@1", "small@1", "mid@1"


def registry() -> Registry:
    reg = Registry()
    for rev, out_price in ((BIG, 8000), (SMALL, 1000), (MID, 3000)):
        reg.apply(new_event(ModelRevisionApproved(model_revision=rev, model_path="/m", engine_config_hash="h",
                                                  max_model_len=512, price_input_per_1k_micros=100,
                                                  price_output_per_1k_micros=out_price, actor="t"),
                            tenant_id="_platform", correlation_id="a"))
    return reg


def scores(reg: Registry, *rows: tuple[str, str, float]) -> None:
    reg.apply(new_event(EvalScoresRecorded(source="run", rows=tuple(EvalRow(task=t, model_revision=r, score=s)
                                                                    for t, r, s in rows), actor="t"),
                        tenant_id="_platform", correlation_id="a"))


def ask(text="hi", *, tenant="acme", app="default", endpoint="chat.completions", tag=None, tokens=10) -> RouteAsk:
    return RouteAsk(tenant, app, endpoint, tag, tokens, text)


SMART = RouteRule(name="smart", task="qa", revisions=(SMALL, MID, BIG), bar=0.8, hard_input_tokens=100,
                  hard_words=("prove",))


def test_static_rules_match_on_every_field_they_name_and_the_first_that_applies_chooses():
    reg = registry()
    rules = (RouteRule(name="tagged", tag="cheap", revision=SMALL),
             RouteRule(name="beta-batchy", tenant="beta", endpoint="completions", revision=MID),
             RouteRule(name="beta", tenant="beta", revision=SMALL))
    assert choose(reg, rules, BIG, ask()).rule == DEFAULT_RULE
    assert choose(reg, rules, BIG, ask(tag="cheap")).revision == SMALL
    assert choose(reg, rules, BIG, ask(tenant="beta", endpoint="completions")).rule == "beta-batchy"
    assert choose(reg, rules, BIG, ask(tenant="beta")).rule == "beta"
    reg.apply(new_event(ModelRevisionRetired(model_revision=SMALL, actor="t"), tenant_id="_platform",
                        correlation_id="a"))
    assert choose(reg, rules, BIG, ask(tag="cheap")).revision == BIG, "never a revision that cannot be pinned"


def test_a_dynamic_rule_picks_the_cheapest_revision_clearing_the_bar_per_difficulty_and_stays_static_without_data():
    reg = registry()
    assert choose(reg, (SMART,), BIG, ask()) == choose(reg, (), BIG, ask()), "no eval data: static"
    scores(reg, ("qa/easy", SMALL, 0.85), ("qa/easy", MID, 0.9), ("qa/easy", BIG, 0.95),
           ("qa/hard", SMALL, 0.4), ("qa/hard", MID, 0.82), ("qa/hard", BIG, 0.93))
    easy = choose(reg, (SMART,), BIG, ask())
    assert (easy.revision, easy.rule, easy.band) == (SMALL, "smart", "easy")
    assert choose(reg, (SMART,), BIG, ask(tokens=100)).revision == MID, "long: hard band"
    assert choose(reg, (SMART,), BIG, ask("Prove that it halts")).revision == MID, "a marker word: hard band"
    scores(reg, ("qa/easy", SMALL, 0.6))  # a new eval run: the small model falls below the bar
    assert choose(reg, (SMART,), BIG, ask()).revision == MID
    scores(reg, ("qa/hard", MID, 0.5), ("qa/hard", BIG, 0.7))
    assert choose(reg, (SMART,), BIG, ask(tokens=200)).rule == DEFAULT_RULE, "none clears the bar: the alias's own"


def test_a_task_without_bands_is_scored_as_a_whole():
    reg = registry()
    scores(reg, ("qa", SMALL, 0.9), ("qa", BIG, 0.95))
    assert choose(reg, (SMART,), BIG, ask(tokens=500)).revision == SMALL
