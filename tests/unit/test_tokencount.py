"""The API's token counter loads tokenizers ahead of the first request that needs them."""
from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from api import app as app_module
from api.app import create_app
from api.deps import Services
from api.stream_hub import StreamHub
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from pipelines.bootstrap import open_log
from pipelines.generation.tokencount import TokenCounter
from tests.helpers import wait_until
from workers.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_model(tmp_path_factory.mktemp("tok") / "tiny", seed=0))


def test_warm_loads_each_tokenizer_once_and_counting_then_loads_nothing(tiny, tmp_path):
    counter = TokenCounter()
    before = TokenCounter._tokenizer.cache_info()
    assert not counter.loaded(tiny)
    assert counter.warm([tiny, tiny, str(tmp_path / "no-such-model")]) == 1, "the missing one is reported, not raised"
    assert counter.loaded(tiny) and not counter.loaded(str(tmp_path / "no-such-model"))
    after = TokenCounter._tokenizer.cache_info()
    assert after.misses - before.misses == 2  # the tiny model and the missing path, each tried once
    assert counter.count(tiny, "hello there") > 0
    assert TokenCounter._tokenizer.cache_info().misses == after.misses, "counting after warming loaded again"
    with pytest.raises(OSError):  # the request that needs the missing one gets the error
        counter.count(str(tmp_path / "no-such-model"), "hi")
    assert not counter.loaded(str(tmp_path / "no-such-model"))
    fresh = TokenCounter()
    fresh.count(tiny, "hi")
    assert fresh.loaded(tiny), "counting loads it too"


class RecordingCounter(TokenCounter):
    def __init__(self):
        super().__init__()
        self.warmed: list[str] = []
        self.done = threading.Event()

    def warm(self, model_paths) -> int:
        paths = list(model_paths)
        self.warmed += paths
        self.done.set()
        return len(paths)


def test_the_api_warms_every_approved_revision_at_start_and_each_one_approved_later(tmp_path, monkeypatch):
    monkeypatch.setattr(app_module, "WARM_EVERY_S", 0.05)
    settings = Settings(home=tmp_path, event_log_url=f"sqlite:///{tmp_path / 'log.db'}")
    log = open_log(settings)
    try:
        view = RegistryView(log)
        for name in ("a", "b"):
            admin.approve_model(view, alias=name, model_revision=f"{name}@1", model_path=f"/models/{name}",
                                engine_config_hash="h", max_model_len=512, actor="t",
                                price_input_per_1k_micros=0, price_output_per_1k_micros=0)
        counter = RecordingCounter()
        app = create_app(Services(settings=settings, log=log, registry_view=RegistryView(log),
                                  counter=counter, hub=StreamHub(log, idle_wait_s=0.02)))
        with TestClient(app) as client:
            assert client.get("/healthz").status_code == 200
            assert counter.done.wait(10), "the API did not warm its tokenizers"
            assert sorted(counter.warmed) == ["/models/a", "/models/b"]
            admin.approve_model(view, alias="c", model_revision="c@1", model_path="/models/c", engine_config_hash="h",
                                max_model_len=512, actor="t")
            wait_until(lambda: "/models/c" in counter.warmed, 10, what="the later revision to be warmed")
        assert sorted(counter.warmed) == ["/models/a", "/models/b", "/models/c"], "a path was warmed twice"
    finally:
        log.close()
