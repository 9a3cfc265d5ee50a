"""Opening and closing kafka-python clients so that none is left running.

kafka-python 3.0.12 starts a client's I/O thread before it reaches the broker; when that
fails, the constructor raises with the thread still running (reconnecting for good), and
the caller never gets a handle to close. `open_client` stops it. `close_all` closes several
clients, each even when one before it fails.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable, TypeVar

logger = logging.getLogger(__name__)

C = TypeVar("C")


def open_client(cls: type[C], **config) -> C:
    """`cls(**config)` (a `KafkaAdminClient`, `KafkaConsumer` or `KafkaProducer`); one that
    fails to start has its network client closed, which ends its I/O thread."""
    client = cls.__new__(cls)
    try:
        client.__init__(**config)
    except BaseException:
        network = getattr(client, "_client", None)  # set before the bootstrap that fails
        if network is not None:
            try:
                network.close()
            except Exception as exc:  # noqa: BLE001 - the constructor's own error is the one to report
                logger.info("closing a %s that failed to start failed too: %r", cls.__name__, exc)
        raise
    return client


def close_all(closers: Iterable[Callable[[], object]]) -> None:
    """Calls every closer; the first failure goes up once all were called."""
    failure: BaseException | None = None
    for close in closers:
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - raised below, after the rest are closed
            failure = failure or exc
    if failure is not None:
        raise failure
