"""The cancel watch reads past requests without decoding them: its pre-filter must hold
for every cancel as the log stores it, and for no other event of the requests topic."""
from __future__ import annotations

from datetime import datetime, timezone

from models.events import encode, new_event
from models.events_generation import CancelRequested, GenerationRequested, Position, PromptSubmitted
from workers.cancel_watch import CancelWatch


def test_every_stored_cancel_passes_the_filter_and_other_requests_do_not():
    cancels = [new_event(CancelRequested(request_id=rid, reason=reason), tenant_id="t", correlation_id=rid)
               for rid, reason in (("r1", "client"), ("CancelRequested", "client_gone"), ("é\"x", "client"))]
    assert all(CancelWatch.CANCEL_TYPE in encode(env) for env in cancels)
    others = [
        new_event(GenerationRequested(request_id="r2", model_alias="m", model_revision="m@1", input_tokens=1,
                                      input_sha256="0" * 64, max_output_tokens=1,
                                      deadline_at=datetime.now(timezone.utc),
                                      prompt_ref=Position(topic="p", partition=0, offset=0)),
                  tenant_id="t", correlation_id="r2"),
        new_event(PromptSubmitted(request_id="r3", prompt="please cancel this"), tenant_id="t", correlation_id="r3"),
    ]
    assert not any(CancelWatch.CANCEL_TYPE in encode(env) for env in others)
