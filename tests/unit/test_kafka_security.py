"""Kafka SASL and TLS settings become the options of every Kafka client; plaintext adds
none, and an incomplete SASL setting is refused with what is missing."""
from __future__ import annotations

import pytest

from models.settings import Settings
from pipelines.kafka_security import kafka_security


def test_plaintext_adds_nothing(tmp_path):
    assert kafka_security(Settings(home=tmp_path)) == {}


def test_sasl_over_tls(tmp_path):
    settings = Settings(home=tmp_path, kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="SCRAM-SHA-512",
                        kafka_sasl_username="ledgerlm", kafka_sasl_password="s3cret", kafka_ssl_cafile="/etc/ca.pem")
    assert kafka_security(settings) == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "ledgerlm",
        "sasl_plain_password": "s3cret", "ssl_check_hostname": True, "ssl_cafile": "/etc/ca.pem",
        "ssl_certfile": None, "ssl_keyfile": None}
    assert "s3cret" not in repr(settings)


def test_mutual_tls_without_sasl(tmp_path):
    settings = Settings(home=tmp_path, kafka_security_protocol="SSL", kafka_ssl_cafile="ca", kafka_ssl_certfile="c",
                        kafka_ssl_keyfile="k")
    options = kafka_security(settings)
    assert options["security_protocol"] == "SSL" and "sasl_mechanism" not in options
    assert (options["ssl_certfile"], options["ssl_keyfile"]) == ("c", "k")


def test_incomplete_sasl_is_refused(tmp_path):
    with pytest.raises(ValueError, match="MECHANISM"):
        kafka_security(Settings(home=tmp_path, kafka_security_protocol="SASL_PLAINTEXT"))
    with pytest.raises(ValueError, match="USERNAME"):
        kafka_security(Settings(home=tmp_path, kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="PLAIN"))
