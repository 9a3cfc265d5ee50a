"""The bootstrap turns settings into adapters: each URL's scheme picks the adapter, the
engine factory setting picks the engine, and nothing connects until a method is called."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from models import topics
from models.settings import Settings
from pipelines.bootstrap import Bootstrap, resolve

ROOT = Path(__file__).resolve().parents[2]


class FakeEngine:
    """What a test names in `engine_factory` to run the platform without vLLM."""

    def __init__(self, settings: Settings):
        self.settings = settings

    @classmethod
    def from_settings(cls, settings: Settings) -> FakeEngine:
        return cls(settings)


def settings(tmp_path: Path, **values) -> Settings:
    """Settings under `tmp_path`, embedded where `values` name no URL, whatever the environment says."""
    unset = dict.fromkeys(("event_log_url", "event_log_namespace", "database_url", "object_store_url",
                           "celery_broker_url"), "")
    return Settings(home=tmp_path, **{**unset, **values})


def test_the_embedded_log_is_made_under_home_with_every_topic(tmp_path):
    from pipelines.eventlog.embedded import EmbeddedEventLog

    with Bootstrap(settings(tmp_path / "home")).event_log() as log:
        assert isinstance(log, EmbeddedEventLog)
        assert {t.name: log.partitions(t.name) for t in topics.ALL} == {t.name: t.partitions for t in topics.ALL}
    assert (tmp_path / "home" / "eventlog.db").exists()


def test_a_namespace_wraps_the_log_and_topics_are_made_only_when_asked(tmp_path):
    from pipelines.eventlog import UnknownTopic
    from pipelines.eventlog.namespaced import NamespacedEventLog

    platform = Bootstrap(settings(tmp_path, event_log_namespace="ns1"))
    with platform.event_log(create_topics=False) as log:
        assert isinstance(log, NamespacedEventLog)
        with pytest.raises(UnknownTopic):
            log.partitions(topics.REQUESTS.name)
    with platform.event_log() as log:
        assert log.partitions(topics.REQUESTS.name) == topics.REQUESTS.partitions


@pytest.mark.parametrize("factor", [None, 3])
def test_the_replication_factor_setting_reaches_the_kafka_adapter(tmp_path, monkeypatch, factor):
    opened = {}

    def open_event_log(url, **options):
        opened.update(options, url=url)
        return object()
    monkeypatch.setattr("pipelines.bootstrap.open_event_log", open_event_log)
    Bootstrap(settings(tmp_path, event_log_url="kafka://k1:9092,k2:9092",
                       kafka_replication_factor=factor)).event_log(create_topics=False)
    assert opened["url"] == "kafka://k1:9092,k2:9092"
    assert opened.get("replication_factor") == factor  # unset: the adapter leaves it to the cluster


def test_a_log_whose_topics_cannot_be_made_is_closed_before_the_error_goes_up(tmp_path, monkeypatch):
    class Refusing:
        closed = False

        def ensure_topics(self, specs):
            raise RuntimeError("the cluster refuses new topics")

        def close(self):
            self.closed = True
    made = Refusing()
    monkeypatch.setattr("pipelines.bootstrap.open_event_log", lambda url, **options: made)
    with pytest.raises(RuntimeError, match="refuses"):
        Bootstrap(settings(tmp_path, event_log_url="kafka://k1:9092")).event_log()
    assert made.closed


def test_the_projection_database_follows_its_url(tmp_path):
    platform = Bootstrap(settings(tmp_path, database_url="postgresql+psycopg://u:p@127.0.0.1:1/ledger"))
    engine = platform.projection_db()  # made, not connected: nothing listens on port 1
    assert engine.dialect.name == "postgresql" and engine.url.database == "ledger"
    engine.dispose()
    other = platform.projection_db(f"sqlite:///{tmp_path / 'other.db'}")  # a verb's --db wins
    assert other.dialect.name == "sqlite" and other.url.database == str(tmp_path / "other.db")
    other.dispose()


@pytest.mark.parametrize("url, adapter", [("file://{tmp}/objects", "LocalObjectStore"),
                                          ("memory://bootstrap-test", "MemoryObjectStore"),
                                          ("s3://bucket/prefix", "S3ObjectStore")])
def test_the_object_store_follows_its_url(tmp_path, url, adapter):
    store = Bootstrap(settings(tmp_path, object_store_url=url.format(tmp=tmp_path), s3_endpoint_url="http://127.0.0.1:1",
                               s3_key="k", s3_secret="s")).object_store()
    assert type(store).__name__ == adapter
    assert store.url == url.format(tmp=tmp_path)


def test_the_object_store_refuses_a_url_it_does_not_know(tmp_path):
    with pytest.raises(ValueError, match="unsupported object store URL"):
        Bootstrap(settings(tmp_path, object_store_url="ftp://host/x")).object_store()


def test_the_batch_queue_is_configured_from_settings(tmp_path):
    platform = Bootstrap(settings(tmp_path, celery_broker_url="redis://127.0.0.1:1/0", batch_queue="b7",
                                  batch_chunk_time_limit_s=60))
    config = platform.celery_config()
    assert config["broker_url"] == "redis://127.0.0.1:1/0"
    assert config["task_default_queue"] == "b7"
    assert config["task_soft_time_limit"] == 60
    queue = platform.chunk_queue()  # no connection until a chunk is sent
    try:
        assert queue.queue == "b7"
    finally:
        queue.close()
    embedded = Bootstrap(settings(tmp_path)).celery_config()
    assert embedded["broker_url"] == f"sqla+sqlite:///{tmp_path.resolve()}/celery.db"


def test_the_registry_view_reads_the_log_it_is_given(tmp_path):
    from pipelines.admin import commands as admin

    platform = Bootstrap(settings(tmp_path))
    with platform.event_log() as log:
        admin.create_tenant(platform.registry_view(log), tenant_id="acme", name="Acme", actor="tests")
        assert "acme" in platform.registry_view(log).refresh().tenants


def test_the_engine_factory_setting_is_honoured(tmp_path):
    platform = Bootstrap(settings(tmp_path, engine_factory=f"{__name__}:FakeEngine.from_settings", max_model_len=64))
    engine = platform.engine()
    assert isinstance(engine, FakeEngine) and engine.settings.max_model_len == 64
    assert platform.engine(max_model_len=128).settings.max_model_len == 128, "overrides reach the factory"
    assert platform.settings.max_model_len == 64, "and leave the platform's settings as they were"


def test_the_default_engine_factory_is_vllms():
    from workers.vllm_engine import VllmEngine

    assert Settings().engine_factory == "workers.vllm_engine:VllmEngine.from_settings"
    assert resolve(Settings().engine_factory) == VllmEngine.from_settings


@pytest.mark.parametrize("name, message", [("workers.vllm_engine", "not a factory name"),
                                           (":FakeEngine", "not a factory name"),
                                           (f"{__name__}:NoSuchEngine", "has no NoSuchEngine")])
def test_a_factory_name_that_names_nothing_is_refused(name, message):
    with pytest.raises(ValueError, match=message):
        resolve(name)


def test_a_factory_name_that_names_no_callable_is_refused():
    with pytest.raises(TypeError, match="is not callable"):
        resolve(f"{__name__}:ROOT")


def test_importing_and_building_the_bootstrap_loads_no_client():
    """Nothing connects at import: not even the client libraries are loaded until used."""
    script = ("import json, sys\n"
              "from models.settings import Settings\n"
              "from pipelines.bootstrap import Bootstrap\n"
              "Bootstrap(Settings(event_log_url='kafka://127.0.0.1:1', database_url='postgresql://x@127.0.0.1:1/x',"
              " object_store_url='s3://b/p', celery_broker_url='redis://127.0.0.1:1'))\n"
              "print(json.dumps(sorted(m for m in ('kafka', 'sqlalchemy', 's3fs', 'celery', 'vllm', 'workers')"
              " if m in sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == []
