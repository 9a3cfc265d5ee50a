"""The Fleet page's service-level section after real traffic: latency per revision and
prompt class, availability and rejections, equal to what the projections hold for the
window; the window can be picked, and one that means nothing is refused."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until


def _cells(html: str, row_class: str, **data) -> list[str]:
    attrs = "".join(f' data-{k}="{v}"' for k, v in data.items())
    found = re.search(rf'<tr class="{row_class}"{attrs}>(.*?)</tr>', html, re.S)
    assert found, f"no {row_class} row {data} on the page"
    return re.findall(r"<td[^>]*>(.*?)</td>", found.group(1), re.S)


def _count(engine, where: str, since: datetime) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT COUNT(*) FROM generations WHERE created_at >= :since AND {where}"),
                                {"since": since}).scalar())


def test_the_fleet_page_shows_service_levels_of_the_window(console_platform):
    cp = console_platform
    revision = cp.platform.model_revision
    _, secret = cp.platform.tenant(requests_per_minute=1)
    with cp.platform.client(secret) as client:
        first = client.post("/v1/generations", json={"model_alias": MODEL_ALIAS, "input": "how are you",
                                                     "max_output_tokens": 4, "stream": False})
        assert first.status_code == 200, first.text
        second = client.post("/v1/generations", json={"model_alias": MODEL_ALIAS, "input": "and now?",
                                                      "max_output_tokens": 4, "stream": False})
        assert second.status_code == 429, second.text
    first_id = first.json()["request_id"]
    since = datetime.now(timezone.utc) - timedelta(hours=1)

    def projected() -> bool:
        cp.project()
        return _count(cp.engine, f"request_id = '{first_id}' AND settled", since) == 1 and \
            _count(cp.engine, "reject_reason = 'rate'", since) >= 1
    wait_until(projected, 60, every_s=0.2, what="the completion and the rejection to be projected")

    with cp.signed_in(cp.operator) as browser:
        page = browser.get("/console/fleet")
    assert page.status_code == 200
    html = page.text
    assert '<section id="slo" data-window="1h">' in html and "Service levels" in html
    # Every prompt of the console's traffic is a few words: all short, at the one revision.
    assert set(re.findall(r'<tr class="slo-latency" data-revision="([^"]+)" data-class="([^"]+)"', html)) == {
        (revision, "short")}
    completed = _count(cp.engine, f"status = 'completed' AND cache_entry_id IS NULL AND model_revision = '{revision}'",
                       since)
    latency = _cells(html, "slo-latency", revision=revision, **{"class": "short"})
    assert int(latency[2].replace(",", "")) == completed > 0
    assert float(latency[3]) >= 0 and latency[4] != ""  # p95s are shown

    admitted = _count(cp.engine, "reject_reason IS NULL AND status <> 'requested'", since)
    total = _cells(html, "slo-availability", revision="", **{"class": ""})
    assert int(total[2].replace(",", "")) == admitted
    assert int(total[3].replace(",", "")) == _count(cp.engine, "status = 'completed'", since)
    assert total[9].endswith("%")
    rate = _cells(html, "slo-rejection", reason="rate")
    assert int(rate[4]) == _count(cp.engine, "reject_reason = 'rate'", since) and int(rate[1]) == int(rate[4])


def test_the_window_can_be_picked_and_a_bad_one_is_refused(console_platform):
    cp = console_platform
    with cp.signed_in(cp.operator) as browser:
        picked = browser.get("/console/fleet?slo_window=15m")
        assert picked.status_code == 200 and '<section id="slo" data-window="15m">' in picked.text
        refused = browser.get("/console/fleet?slo_window=forever")
        assert refused.status_code == 400 and "not a window" in refused.text
