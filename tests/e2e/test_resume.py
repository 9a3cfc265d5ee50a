"""Resuming a stream with `Last-Event-ID`: the frames after that id, each once, so the
client's `seq`s run on with no gap and no repeat; a malformed id is a 400."""
from __future__ import annotations

from tests.e2e.test_streaming import sse_frames
from tests.harness import MODEL_ALIAS
from tests.conftest import platform_both_ways

platform = platform_both_ways()  # each test also runs with admission in the worker

BODY = {"model_alias": MODEL_ALIAS, "input": "a story in many words", "max_output_tokens": 300, "ignore_eos": True}


def token_seqs(frames) -> list[int]:
    return [data["seq"] for _, data in frames if isinstance(data, dict) and data["type"] == "tokens"]


def events(client, request_id: str, last_event_id: str | None = None) -> list:
    headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
    with client.stream("GET", f"/v1/generations/{request_id}/events", headers=headers) as response:
        assert response.status_code == 200, response.read()
        return list(sse_frames(response))


def test_a_dropped_stream_resumes_live_with_no_gap_and_no_duplicate(platform, monkeypatch):
    # The grace a client has to come back: long enough for a loaded host to see the drop
    # and the reconnect in turn (the deployed 2 s is a setting, tested on its own).
    monkeypatch.setattr(platform.app.state.services.reaper, "grace_s", 15.0)
    _, secret = platform.tenant()
    with platform.client(secret) as client:
        with client.stream("POST", "/v1/generations", json=BODY) as response:
            frames = sse_frames(response)
            # Started and the first tokens, then the line drops. (Tokens that pile up while an
            # append is in flight share one frame, so there may be only a few frames in all.)
            before = [next(frames), next(frames)]
        request_id = before[0][1]["request_id"]
        assert [d["type"] for _, d in before] == ["started", "tokens"]
        after = events(client, request_id, str(before[-1][0]))

    assert after[-1] == (None, "[DONE]")
    assert len(after) >= 2, "the rest of the stream, its end included"
    ids = [i for i, _ in before + after[:-1]]
    assert ids == sorted(set(ids)), "ids go on increasing, none repeated"
    seqs = token_seqs(before) + token_seqs(after)
    assert seqs == list(range(len(seqs)))
    final = after[-2][1]
    assert final["type"] == "completed", "a client back within the grace keeps its generation"
    assert final["usage"]["output_tokens"] == BODY["max_output_tokens"]
    all_frames = before + after
    assert sum(d["token_count"] for _, d in all_frames if isinstance(d, dict) and d["type"] == "tokens") == 300


def test_a_finished_stream_replays_whole_or_after_any_event(platform):
    _, secret = platform.tenant()
    with platform.client(secret) as client:
        with client.stream("POST", "/v1/generations", json={**BODY, "max_output_tokens": 20}) as response:
            original = list(sse_frames(response))
        request_id = original[0][1]["request_id"]
        assert events(client, request_id) == original
        middle = len(original) // 2
        assert events(client, request_id, str(original[middle][0])) == original[middle + 1:]
        last = original[-2][0]  # the end event's id: nothing follows it
        assert events(client, request_id, str(last)) == [(None, "[DONE]")]


def test_a_malformed_last_event_id_is_a_400(platform):
    _, secret = platform.tenant()
    with platform.client(secret) as client:
        done = client.post("/v1/generations", json={**BODY, "max_output_tokens": 2, "stream": False})
        for bad in ["abc", "-1", "1.5", "9" * 40, ""]:
            response = client.get(f"/v1/generations/{done.json()['id']}/events", headers={"Last-Event-ID": bad})
            assert response.status_code == 400, bad
            assert response.json()["error"]["code"] == "invalid_last_event_id"
