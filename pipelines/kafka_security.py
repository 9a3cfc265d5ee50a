"""How every Kafka client of a process authenticates and encrypts: the settings'
`kafka_*` security fields as kafka-python's client options (none for plaintext)."""
from __future__ import annotations

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def kafka_security(settings) -> dict:
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return {}
    options: dict = {"security_protocol": protocol}
    if protocol.startswith("SASL_"):
        if settings.kafka_sasl_mechanism not in SASL_MECHANISMS:
            raise ValueError(f"{protocol} needs LEDGERLM_KAFKA_SASL_MECHANISM, one of {', '.join(SASL_MECHANISMS)}")
        if not settings.kafka_sasl_username or settings.kafka_sasl_password is None:
            raise ValueError(f"{protocol} needs LEDGERLM_KAFKA_SASL_USERNAME and LEDGERLM_KAFKA_SASL_PASSWORD")
        options.update(sasl_mechanism=settings.kafka_sasl_mechanism, sasl_plain_username=settings.kafka_sasl_username,
                       sasl_plain_password=settings.kafka_sasl_password)
    if protocol.endswith("SSL"):
        options.update(ssl_check_hostname=settings.kafka_ssl_check_hostname, ssl_cafile=settings.kafka_ssl_cafile,
                       ssl_certfile=settings.kafka_ssl_certfile, ssl_keyfile=settings.kafka_ssl_keyfile)
    return options
