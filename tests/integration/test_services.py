"""The real services started by `infra/services.sh up` answer on the URLs in
.local/services.env, with the settings the platform relies on (single-node Kafka
transactions, a Postgres role that may create databases, the test bucket).
A missing variable fails the test: these exist to run against the real thing."""
from __future__ import annotations

import os
import socket
import uuid
from urllib.parse import urlparse

import pytest


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run `infra/services.sh up` and source "
                    f".local/services.env (or run `make test`)", pytrace=False)
    return value


def _tcp_reachable(host: str, port: int) -> None:
    with socket.create_connection((host, port), timeout=5):
        pass


@pytest.fixture
def kafka_bootstrap(kafka_url) -> str:
    url = urlparse(kafka_url)
    assert url.scheme == "kafka", url
    _tcp_reachable(url.hostname, url.port)
    return f"{url.hostname}:{url.port}"


def test_kafka_answers_metadata(kafka_bootstrap):
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    try:
        assert isinstance(admin.list_topics(), list)
    finally:
        admin.close()


def test_kafka_single_node_commits_transactions(kafka_bootstrap):
    """Transactions need the single-node replication settings; without them
    init_transactions blocks until its timeout."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    topic = f"svc-check-{uuid.uuid4().hex[:12]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    try:
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=topic,
                                 max_block_ms=30_000)
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(topic, key=b"tenant-a", value=b"committed")
            producer.commit_transaction()
        finally:
            producer.close()

        consumer = KafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=topic,
                                 auto_offset_reset="earliest", isolation_level="read_committed",
                                 consumer_timeout_ms=20_000)
        try:
            record = next(iter(consumer))
        finally:
            consumer.close()
        assert (record.key, record.value) == (b"tenant-a", b"committed")
    finally:
        admin.delete_topics([topic])
        admin.close()


def test_postgres_runs_queries_and_creates_databases(postgres_url):
    from sqlalchemy import create_engine, text

    engine = create_engine(postgres_url, connect_args={"connect_timeout": 5},
                           isolation_level="AUTOCOMMIT")
    name = f"svc_check_{uuid.uuid4().hex[:12]}"
    try:
        with engine.connect() as conn:
            assert conn.execute(text("select 1")).scalar_one() == 1
            conn.execute(text(f"create database {name}"))
            conn.execute(text(f"drop database {name}"))
    finally:
        engine.dispose()


def test_redis_answers_ping(redis_url):
    url = urlparse(redis_url)
    assert url.scheme == "redis", url
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(64).startswith(b"+PONG")


def test_s3_bucket_round_trips_an_object(s3_endpoint):
    import s3fs

    bucket = os.environ.get("LEDGERLM_TEST_S3_BUCKET", "ledgerlm-test")
    fs = s3fs.S3FileSystem(
        key=_env("LEDGERLM_TEST_S3_KEY"),
        secret=_env("LEDGERLM_TEST_S3_SECRET"),
        client_kwargs={"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
        config_kwargs={"connect_timeout": 5, "read_timeout": 10,
                       "retries": {"max_attempts": 2}},
        skip_instance_cache=True,
    )
    key = f"{bucket}/svc-check/{uuid.uuid4().hex}.txt"
    fs.ls(bucket)
    fs.pipe(key, b"parquet goes here")
    try:
        assert fs.cat(key) == b"parquet goes here"
        assert key in fs.ls(f"{bucket}/svc-check", refresh=True)
    finally:
        fs.rm(key)
