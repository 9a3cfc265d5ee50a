"""Open-loop load for the benches: calls at a fixed rate, whatever earlier calls are doing."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable


def open_loop(rate: float, total: int, one: Callable[[int], float | None], *, first: int = 0,
              threads: int = 64) -> tuple[list[float], int]:
    """Calls `one(i)` for i from `first`, `total` times at `rate` a second, each at its own
    time; returns what the calls returned, and how many returned None (an error)."""
    values: list[float] = []
    errors = 0
    lock = threading.Lock()

    def call(i: int) -> None:
        nonlocal errors
        value = one(i)
        with lock:
            if value is None:
                errors += 1
            else:
                values.append(value)
    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for i in range(total):
            delay = began + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(call, first + i)
    return values, errors
