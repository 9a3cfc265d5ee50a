"""How a document is summarized within a model's context, and the most it can cost.
Pure arithmetic on token counts, shared by the dispatcher (to reserve budget) and the
worker (to run it), so the reservation always covers what runs.

A prompt is `prefix + content + suffix` in token ids (the template split at `{text}`),
so its length is exact. A document whose content fits the window is summarized in one
call. A longer one is split into `pieces` even slices (map); their summaries are joined,
`group` at a time, and summarized again (reduce) until one remains. Each summary is at
most `max_output_tokens`, plus `sep` tokens of separator, so every reduce call fits too.
"""
from __future__ import annotations

from dataclasses import dataclass

OUTPUT_SCHEMA = (  # the documented columns of a summarization job's Parquet output
    ("id", "string"), ("summary", "string"), ("input_tokens", "int64"), ("output_tokens", "int64"),
    ("finish_reason", "string"), ("model_revision", "string"), ("error", "string"),
)


class PlanError(ValueError):
    pass


@dataclass(frozen=True)
class Shape:
    """What bounds every call of a job."""

    context: int  # the model's max_model_len
    overhead: int  # prefix + suffix tokens of the template
    max_output_tokens: int
    sep: int  # tokens of the separator between joined summaries

    @property
    def window(self) -> int:
        """Most content tokens one call may take."""
        return self.context - self.overhead - self.max_output_tokens

    @property
    def group(self) -> int:
        """Most summaries one reduce call may join."""
        return self.window // (self.max_output_tokens + self.sep)

    def check(self) -> None:
        if self.window < 1:
            raise PlanError(f"the template ({self.overhead} tokens) and max_output_tokens "
                            f"({self.max_output_tokens}) leave no room in a context of {self.context}")
        if self.group < 2:
            raise PlanError(f"max_output_tokens {self.max_output_tokens} is too large to combine summaries "
                            f"within a context of {self.context}; use at most "
                            f"{(self.context - self.overhead) // 3 - self.sep}")


@dataclass(frozen=True)
class Plan:
    pieces: int  # 1: one call, no map-reduce
    reduce_levels: tuple[int, ...]  # calls at each reduce level
    input_tokens_bound: int
    output_tokens_bound: int

    @property
    def map_reduce(self) -> bool:
        return self.pieces > 1

    @property
    def calls(self) -> int:
        return self.pieces + sum(self.reduce_levels)


def plan(doc_tokens: int, shape: Shape) -> Plan:
    shape.check()
    if doc_tokens <= shape.window:
        return Plan(1, (), doc_tokens + shape.overhead, shape.max_output_tokens)
    pieces = -(-doc_tokens // shape.window)
    input_bound = doc_tokens + pieces * shape.overhead
    levels, items = [], pieces
    while items > 1:
        calls = -(-items // shape.group)
        input_bound += items * (shape.max_output_tokens + shape.sep) + calls * shape.overhead
        levels.append(calls)
        items = calls
    return Plan(pieces, tuple(levels), input_bound, (pieces + sum(levels)) * shape.max_output_tokens)


def split_even(ids: list[int], pieces: int) -> list[list[int]]:
    """`pieces` consecutive slices whose lengths differ by at most one."""
    size, extra = divmod(len(ids), pieces)
    out, start = [], 0
    for i in range(pieces):
        end = start + size + (1 if i < extra else 0)
        out.append(ids[start:end])
        start = end
    return out


def groups(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]
