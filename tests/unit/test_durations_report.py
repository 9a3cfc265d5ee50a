"""The slowest tests and each lane's total, read from a run's junit XML."""
from __future__ import annotations

from tests import durations_report

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.unit.test_a" name="test_quick" time="0.250">
  <properties><property name="lane" value="unit" /></properties></testcase>
<testcase classname="tests.e2e.test_b" name="test_slow[kafka]" time="42.5">
  <properties><property name="lane" value="platform" /></properties></testcase>
<testcase classname="tests.e2e.test_b" name="test_slow[embedded]" time="7.5">
  <properties><property name="lane" value="platform" /></properties><failure message="boom" /></testcase>
<testcase classname="tests.integration.test_c" name="test_no_property" time="1.0" />
</testsuite></testsuites>"""


def test_each_test_case_is_read_with_its_lane_and_time(tmp_path):
    path = tmp_path / "run.xml"
    path.write_text(XML)
    timed = durations_report.read(path)
    assert [(t.test, t.lane, t.seconds) for t in timed] == [
        ("tests.unit.test_a::test_quick", "unit", 0.25),
        ("tests.e2e.test_b::test_slow[kafka]", "platform", 42.5),
        ("tests.e2e.test_b::test_slow[embedded]", "platform", 7.5),
        ("tests.integration.test_c::test_no_property", durations_report.NO_LANE, 1.0),
    ]
    assert durations_report.lane_totals(timed) == {
        "platform": (2, 50.0), durations_report.NO_LANE: (1, 1.0), "unit": (1, 0.25)}


def test_the_report_lists_the_slowest_first_then_each_lane(tmp_path, capsys):
    path = tmp_path / "run.xml"
    path.write_text(XML)
    assert durations_report.main([str(path), "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "2 slowest tests (setup + call + teardown):"
    assert "42.5s" in lines[1] and lines[1].endswith("test_slow[kafka]")
    assert "7.5s" in lines[2] and lines[2].endswith("test_slow[embedded]")
    assert lines[3] == "time per lane:"
    assert lines[4].split() == ["platform", "50.0s", "2", "tests"]
    assert lines[-1].split() == ["all", "51.2s", "4", "tests"]


def test_a_missing_or_broken_file_is_said_plainly(tmp_path, capsys):
    (tmp_path / "cut.xml").write_text("<testsuites><testsuite>")
    assert durations_report.main([str(tmp_path / "absent.xml")]) == 1
    assert durations_report.main([str(tmp_path / "cut.xml")]) == 1
    err = capsys.readouterr().err
    assert "absent.xml" in err and "cut.xml" in err and "Traceback" not in err
