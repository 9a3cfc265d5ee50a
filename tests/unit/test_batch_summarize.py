"""Map-reduce summarization on a fake engine: every call fits the context, long documents
are split and reduced, short ones take one call, and usage adds up over every call."""
from __future__ import annotations

from models.summarization import Shape, plan
from pipelines.batch.tokens import TemplateIds
from workers.batch_engine import GenResult
from workers.summarize import summarize_documents

TIDS = TemplateIds(prefix=(1, 50, 51), suffix=(52,), sep=(9,))
SHAPE = Shape(context=64, overhead=TIDS.overhead, max_output_tokens=8, sep=len(TIDS.sep))


class FakeEngine:
    """Answers every prompt with `max_tokens` tokens; remembers what it was asked."""

    def __init__(self):
        self.calls: list[list[list[int]]] = []

    def generate(self, requests, *, tenant_id):
        assert tenant_id == "acme"
        self.calls.append([r.prompt_token_ids for r in requests])
        return [GenResult(f"s{len(r.prompt_token_ids)}", [7] * r.max_tokens, "length", len(r.prompt_token_ids))
                for r in requests]


def test_long_documents_go_map_reduce_and_short_ones_take_one_call():
    engine = FakeEngine()
    long_doc = list(range(100, 100 + 6 * SHAPE.window))  # six windows of text; five join per reduce
    docs = [{"row": 1, "id": "short", "text_token_ids": [100, 101, 102]},
            {"row": 2, "id": "long", "text_token_ids": long_doc}]
    rows, map_reduced = summarize_documents(docs, engine=engine, tenant_id="acme", tids=TIDS, shape=SHAPE,
                                            temperature=0.0, model_revision="tiny@abc")
    assert map_reduced == 1
    assert [len(c) for c in engine.calls] == [1 + 6, 2, 1]  # one level for both, then two reduce levels
    for call in engine.calls:
        for prompt in call:
            assert len(prompt) + SHAPE.max_output_tokens <= SHAPE.context
            assert prompt[:3] == [1, 50, 51] and prompt[-1] == 52
    # The map level covers the whole text, in order, without overlap.
    map_content = [t for prompt in engine.calls[0][1:] for t in prompt[3:-1]]
    assert map_content == long_doc
    short, long = rows
    assert short == {"id": "short", "summary": "s7", "input_tokens": 7, "output_tokens": 8,
                     "finish_reason": "length", "model_revision": "tiny@abc", "error": None}
    assert long["summary"] is not None and long["error"] is None
    assert long["output_tokens"] == 8 * (6 + 2 + 1)
    assert long["input_tokens"] == sum(len(p) for call in engine.calls for p in call) - 7
    bound = plan(len(long_doc), SHAPE)
    assert long["input_tokens"] <= bound.input_tokens_bound and long["output_tokens"] <= bound.output_tokens_bound


def test_a_refused_call_fails_only_its_document():
    class Refusing(FakeEngine):
        def generate(self, requests, *, tenant_id):
            results = super().generate(requests, tenant_id=tenant_id)
            return [GenResult("", [], None, r.prompt_tokens, error="bad") if i == 0 else r
                    for i, r in enumerate(results)]

    rows, _ = summarize_documents([{"row": 1, "id": "a", "text_token_ids": [5]},
                                   {"row": 2, "id": "b", "text_token_ids": [6]}],
                                  engine=Refusing(), tenant_id="acme", tids=TIDS, shape=SHAPE, temperature=0.0,
                                  model_revision="r")
    assert rows[0]["error"] == "invalid_request: bad" and rows[0]["summary"] is None
    assert rows[1]["error"] is None and rows[1]["summary"] == "s5"
