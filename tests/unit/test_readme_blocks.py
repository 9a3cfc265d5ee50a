"""The README harness (tests/readme_blocks.py) on small synthetic READMEs: which blocks it
takes, that it refuses a skip without a reason, and that a run reports the block that broke,
runs every block in one shell, and leaves no process behind."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.readme_blocks import (ReadmeError, Rewrite, apply_rewrites, extract_blocks, failure_report,
                                 run_blocks)

README = """# x

```sh
echo before the quickstart
```

## Quickstart

```sh
echo a
```

<!-- readme-test: skip: needs a machine with a GPU -->
```sh
exit 3
```

```text
not run
```

## A tour of what it does

```python
print("py")
```

```sh
# a comment line in a block, not a heading
echo tour
```

## Web console

```sh
echo after the tour
```
"""


def _readme(*blocks: str, lang: str = "sh") -> str:
    body = "\n".join(f"```{lang}\n{b}\n```\n" for b in blocks)
    return f"## Quickstart\n\n{body}\n## A tour of what it does\n\n## Next\n"


def _run(tmp_path: Path, readme: str, **bounds):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    bounds = {"timeout_s": 60.0, "block_timeout_s": 30.0, "stop_s": 10.0, **bounds}
    return run_blocks(extract_blocks(readme), cwd=tmp_path, env=env, **bounds)


def test_it_takes_the_sh_and_python_blocks_from_the_quickstart_to_the_end_of_the_tour():
    blocks = extract_blocks(README)
    assert [(b.number, b.lang, b.text, b.skip) for b in blocks] == [
        (1, "sh", "echo a\n", None),
        (2, "sh", "exit 3\n", "needs a machine with a GPU"),
        (3, "python", 'print("py")\n', None),
        (4, "sh", "# a comment line in a block, not a heading\necho tour\n", None),
    ]
    assert README.splitlines()[blocks[0].line - 1] == "```sh"


def test_a_heading_inside_a_block_does_not_end_the_tour():
    readme = _readme("cat <<'X'\n## Not a heading\nX", "echo last")
    assert [b.text for b in extract_blocks(readme)] == ["cat <<'X'\n## Not a heading\nX\n", "echo last\n"]


@pytest.mark.parametrize("marker", ["<!-- readme-test: skip -->", "<!-- readme-test: skip: -->",
                                    "<!-- readme-test: skip:    -->", "<!-- readme-test: ignore: why -->"])
def test_a_skip_marker_without_a_reason_is_refused(marker):
    readme = README.replace("<!-- readme-test: skip: needs a machine with a GPU -->", marker)
    with pytest.raises(ReadmeError, match="needs a reason"):
        extract_blocks(readme)


def test_a_skip_marker_above_no_block_is_refused():
    readme = README.replace("<!-- readme-test: skip: needs a machine with a GPU -->\n",
                            "<!-- readme-test: skip: why -->\n\n")
    with pytest.raises(ReadmeError, match="above no fenced block"):
        extract_blocks(readme)


@pytest.mark.parametrize("heading", ["## Quickstart", "## A tour of what it does"])
def test_a_missing_heading_is_refused(heading):
    with pytest.raises(ReadmeError, match="no '" + heading):
        extract_blocks(README.replace(heading + "\n", "## Renamed\n"))


def test_a_rewrite_must_match_once():
    blocks = extract_blocks(_readme("export URL=http://127.0.0.1:8000", "echo $URL"))
    rewritten = apply_rewrites(blocks, [Rewrite(":8000", ":9001", "a free port")])
    assert rewritten[0].text == "export URL=http://127.0.0.1:9001\n"
    with pytest.raises(ReadmeError, match="matched 0 times"):
        apply_rewrites(blocks, [Rewrite(":8001", ":9001", "a free port")])


def test_a_broken_block_is_reported_by_its_number_and_stops_the_run(tmp_path):
    result = _run(tmp_path, _readme("echo a", "false\necho not reached", "echo c"))
    assert result.returncode != 0 and result.timed_out is None
    assert result.passed == [1]
    assert result.failed is not None and result.failed.number == 2
    assert "not reached" not in result.output
    report = failure_report(result)
    assert report.startswith("README block 2 (README line 7) failed, exit status 1\nfalse\necho not reached")


def test_a_failure_inside_a_pipeline_fails_its_block(tmp_path):
    result = _run(tmp_path, _readme("false | cat"))
    assert result.failed is not None and result.failed.number == 1


def test_a_skipped_block_is_not_run_and_the_rest_share_one_shell(tmp_path):
    readme = ("## Quickstart\n\n```sh\nexport GREETING=hello\ncd sub 2>/dev/null || mkdir sub\n```\n\n"
              "<!-- readme-test: skip: shown only -->\n```sh\nexit 3\n```\n\n## A tour of what it does\n\n"
              "```python\nimport os\nprint(os.environ['GREETING'], os.getcwd())\n```\n\n## Next\n")
    result = _run(tmp_path, readme)
    assert result.returncode == 0 and result.failed is None, failure_report(result)
    assert result.passed == [1, 3]
    assert f"hello {tmp_path}" in result.output


def test_background_jobs_are_stopped_and_none_survives(tmp_path):
    result = _run(tmp_path, _readme("export LEDGERLM_HOME=$PWD/home\nmkdir -p $LEDGERLM_HOME/logs\n"
                                    "sleep 300 > $LEDGERLM_HOME/logs/sleep.log 2>&1 &", "echo started"))
    assert result.returncode == 0, failure_report(result)
    assert result.home == f"{tmp_path}/home"
    assert result.lingering == [] and result.survivors == []


def test_a_block_past_its_bound_is_reported_and_its_processes_killed(tmp_path):
    readme = _readme("echo a", "sleep 300 &\nsleep 300").replace("```sh\necho a", "<!-- readme-test: skip: x -->\n```sh\necho a")
    result = _run(tmp_path, readme, block_timeout_s=1.0)
    assert result.failed is not None and result.failed.number == 2
    assert result.timed_out == "block 2 passed its bound of 1 s"
    assert result.survivors == []


def test_a_job_that_ignores_the_readers_kill_is_reported_as_lingering_then_killed(tmp_path):
    # The job says when it ignores TERM, so the shell's kill cannot come first.
    result = _run(tmp_path, _readme("bash -c 'trap \"\" TERM; touch ignoring; sleep 302' &\n"
                                    "until [ -e ignoring ]; do sleep 0.1; done"), stop_s=1.0, kill_grace_s=1.0)
    assert any("sleep 302" in p for p in result.lingering), result.lingering
    assert result.survivors == []


def test_a_process_that_left_the_session_is_found_by_its_marker_and_killed(tmp_path):
    result = _run(tmp_path, _readme("setsid -f sleep 301 > /dev/null 2>&1"))
    assert result.returncode == 0, failure_report(result)
    assert [s.split(": ", 1)[1] for s in result.lingering] == ["sleep 301"]
    assert [s.split(": ", 1)[1] for s in result.survivors] == ["sleep 301"]
    assert "processes alive after its session was killed: " in failure_report(result)
    assert _run(tmp_path, _readme("true")).survivors == []  # the one found was killed
