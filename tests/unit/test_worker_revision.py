"""Which revision a worker serves, and its refusal to serve one its engine is not."""
from __future__ import annotations

import asyncio

import pytest

from models import topics
from models.registry import Alias, Registry, Revision
from tests.fake_engine import FakeEngine
from workers.engine import EngineMismatch
from workers.revision import UnknownRevision, check_engine, revision_to_serve, warm_up


def registry() -> Registry:
    reg = Registry()
    for name, path, config_hash in (("tiny@1", "/models/tiny", "h1"), ("small@2", "/models/small", "h2")):
        reg.revisions[name] = Revision(name, path, config_hash, 512, 0, 0)
    reg.aliases["fast"] = Alias("fast", "tiny@1", frozenset({"*"}))
    return reg


def test_a_named_revision_an_alias_or_the_configured_model_decide_what_a_worker_serves():
    reg = registry()
    assert revision_to_serve(reg, revision="small@2").model_revision == "small@2"
    assert revision_to_serve(reg, alias="fast").model_revision == "tiny@1"
    found = revision_to_serve(reg, model_path="/models/small", config_hash="h2")
    assert found.model_revision == "small@2"


@pytest.mark.parametrize("ask", [dict(revision="gone@3"), dict(alias="nobody"),
                                 dict(model_path="/models/small", config_hash="h1")])
def test_what_is_not_approved_is_refused_with_a_clear_error(ask):
    with pytest.raises(UnknownRevision, match="approve|not approved|no approved"):
        revision_to_serve(registry(), **ask)


def test_a_retired_revision_is_served_by_no_new_worker():
    reg = registry()
    reg.retired["tiny@1"] = "superseded"
    with pytest.raises(UnknownRevision, match="retired"):
        revision_to_serve(reg, revision="tiny@1")
    assert revision_to_serve(reg, revision="small@2").model_revision == "small@2"


def test_an_engine_that_hashes_differently_is_refused():
    engine = FakeEngine(hold=False)  # hashes to "fake"
    with pytest.raises(EngineMismatch, match="fake.*h1"):
        check_engine(engine, registry().revisions["tiny@1"])
    assert check_engine(engine, Revision("fake@1", "/m", "fake", 512, 0, 0)) == "fake"


def test_warm_up_runs_one_generation_to_its_end():
    engine = FakeEngine(hold=False)
    assert asyncio.run(warm_up(engine)) == 1
    assert len(engine.started) == 1


def test_revision_topic_names_are_valid_and_never_shared():
    names = {topics.work_topic(None, "high", r).name for r in ("a@b", "a-b", "a/b", "A@b")}
    assert len(names) == 4
    for name in names:
        assert len(name) < 200 and all(c.isalnum() or c in "._-" for c in name)
