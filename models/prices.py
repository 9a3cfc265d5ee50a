"""A revision's prices as the command line takes them: micro-units of currency per 1000
tokens, a whole number that is not negative. `ledgerlm model approve` and `ledgerlm admin
model approve` take the same flags, parsed the same way."""
from __future__ import annotations

import argparse

PRICE_FIELDS = ("price_input_per_1k_micros", "price_output_per_1k_micros")
PRICE_FLAGS = tuple("--" + name.replace("_", "-") for name in PRICE_FIELDS)


def micros(text: str) -> int:
    """A price flag's value: a whole number of micro-units, not negative."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of micros, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a price is not negative")
    return value


def add_price_flags(parser: argparse.ArgumentParser) -> None:
    for flag, name in zip(PRICE_FLAGS, PRICE_FIELDS):
        parser.add_argument(flag, dest=name, type=micros, default=0,
                            help="micro-units of currency per 1000 tokens (default 0)")
