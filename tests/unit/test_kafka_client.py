"""The Kafka client as installed: its record checksums run in C.

kafka-python computes the CRC-32C of every record batch it produces or fetches. Without
the `crc32c` package it does so in pure Python, about 340 µs per 4 KB, which made
checksums a visible share of every Kafka process's CPU."""
from __future__ import annotations

import os

from kafka.record import util
from kafka.record._crc32c import crc as crc32c_in_python


def test_record_checksums_use_the_c_implementation_and_agree_with_the_reference():
    assert util.crc32c_c is not None, "install kafka-python[crc32c]: checksums fall back to pure Python"
    data = memoryview(os.urandom(4096))
    assert util.calc_crc32c(data) == crc32c_in_python(data)
