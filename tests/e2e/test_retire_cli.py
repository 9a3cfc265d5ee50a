"""`ledgerlm admin model retire` and `ledgerlm admin model delete-alias` on the embedded log:
each appends its admin event and prints JSON; unknown names and a second retirement fail."""
from __future__ import annotations

from tests.e2e.test_admin_cli import ledgerlm, lines


def test_admin_cli_retires_a_revision_and_deletes_an_alias(tmp_path):
    lines(ledgerlm(tmp_path, "model", "approve", "--alias", "tiny", "--revision", "tiny@abc", "--path", "/m",
                   "--config-hash", "abc", "--max-model-len", "512"))
    lines(ledgerlm(tmp_path, "model", "alias", "tiny-old", "tiny@abc"))
    assert lines(ledgerlm(tmp_path, "model", "delete-alias", "tiny-old")) == [{"alias": "tiny-old", "deleted": True}]
    assert lines(ledgerlm(tmp_path, "model", "retire", "tiny@abc", "--reason", "superseded")) == [
        {"model_revision": "tiny@abc", "retired": True}]
    for bad, said in ((["model", "delete-alias", "tiny-old"], "does not exist"),
                      (["model", "retire", "tiny@abc"], "already retired"),
                      (["model", "retire", "nope@1"], "not approved"),
                      (["model", "alias", "tiny-new", "tiny@abc"], "retired")):
        result = ledgerlm(tmp_path, *bad)
        assert result.returncode == 2 and result.stderr.startswith("error:") and said in result.stderr, \
            (bad, result.stderr)
