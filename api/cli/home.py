"""Which home and event log a `ledgerlm` command uses, said where a mix-up would otherwise
pass silently. Without `LEDGERLM_HOME` the home is `.local/ledgerlm` under the current
directory (`models.settings.DEFAULT_HOME`), so a new shell elsewhere, or one that lost
the variable, reads another log than the one the platform writes:

- a command that uses the platform's state says on stderr, once, which home and log it
  uses when `LEDGERLM_HOME` is unset (stdout stays for what scripts parse);
- a command that needs state already there (a read, or a change to a tenant, key, alias or
  rollout that must exist) is refused, exit 2, when the home is unset and the default
  home has no log yet: reading a log nobody wrote is a mistake, not an empty answer;
- an error about something that does not exist names the log it was looked for in.

Commands that make state from nothing (`serve`, `demo`, `db`, `admin tenant create`,
`model approve`, ...) run on the default home as before, after the line.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from models.settings import DEFAULT_HOME, Settings

# Verbs that touch none of the platform's stored state (they talk HTTP or compute offline).
STATELESS = {"batch", "capacity", "loadtest"}
# Those that may run against a home nothing was written to yet.
MAKES_STATE = {"serve", "demo", "db"}
ADMIN_MAKES_STATE = {("tenant", "create"), ("model", "approve"), ("eval", "upload")}
# `python -m workers` tools (run through `ledgerlm model ...`) that use the home.
MODEL_TOOLS_WITH_STATE = {"approve", "prepare-small"}


def home_is_set(settings: Settings) -> bool:
    return "home" in settings.model_fields_set


def embedded_default(url: str, settings: Settings, name: str) -> Path | None:
    """The file of `url` where it is the embedded store named `name` under the home (the
    settings' default), else None: a URL given explicitly is the operator's choice."""
    path = settings.home.resolve() / name
    return path if url == f"sqlite:///{path}" else None


def log_source(settings: Settings) -> str:
    """Why the log is the one it is, for a message: the variable that named it, or the home."""
    if embedded_default(settings.event_log_url, settings, "eventlog.db") is None:
        return "LEDGERLM_EVENT_LOG_URL"
    if home_is_set(settings):
        return f"LEDGERLM_HOME={settings.home}"
    return f"LEDGERLM_HOME unset: using the default home {DEFAULT_HOME}"


def where(settings: Settings) -> str:
    """'in the log at URL (why)', to end a not-found message with."""
    namespace = f", namespace {settings.event_log_namespace!r}" if settings.event_log_namespace else ""
    return f"in the log at {settings.event_log_url}{namespace} ({log_source(settings)})"


def not_found(message: object, settings: Settings) -> str:
    return f"{message} {where(settings)}"


def start_line(settings: Settings, cwd: Path) -> str:
    """The one line said at the start when LEDGERLM_HOME is unset."""
    home = settings.home.resolve()
    if not (cwd / DEFAULT_HOME.parent).is_dir():
        return (f"ledgerlm: LEDGERLM_HOME is not set and {cwd} has no {DEFAULT_HOME.parent} directory; using a new "
                f"home {home} (log {settings.event_log_url}); set LEDGERLM_HOME to the platform's home to use "
                f"another, or run from the project's directory")
    return f"ledgerlm: LEDGERLM_HOME is not set; using {home} (log {settings.event_log_url})"


def other_homes(cwd: Path) -> list[Path]:
    """Homes with a log under the project's `.local`, to suggest when the default has none."""
    return sorted(p.parent for p in (cwd / DEFAULT_HOME.parent).glob("*/eventlog.db"))


def refusal(settings: Settings, reads: str, cwd: Path) -> str | None:
    """Why a command that reads `reads` ('log' or 'database') is refused, or None."""
    url = settings.event_log_url if reads == "log" else settings.database_url
    path = embedded_default(url, settings, "eventlog.db" if reads == "log" else "ledgerlm.db")
    if home_is_set(settings) or path is None or path.exists():
        return None
    what = "event log" if reads == "log" else "database"
    if not (cwd / DEFAULT_HOME.parent).is_dir():
        return (f"error: LEDGERLM_HOME is not set and {cwd} has no {DEFAULT_HOME.parent} directory, so there is "
                f"no {what} to read ({url}); set LEDGERLM_HOME to the platform's home, or run from the project's "
                f"directory")
    found = other_homes(cwd)
    hint = f" (homes with a log here: {', '.join(map(str, found))})" if found else ""
    return (f"error: LEDGERLM_HOME is not set and the default home {settings.home.resolve()} has no {what} "
            f"({url}): there is nothing to read; set LEDGERLM_HOME to the platform's home{hint}")


def reads(args: argparse.Namespace) -> str | None:
    """The state a parsed `ledgerlm` command needs to exist already: 'log', 'database' or None
    (it touches none, or makes it)."""
    verb = args.verb
    if verb in STATELESS or verb in MAKES_STATE:
        return None
    if verb == "admin":
        return None if (args.what, args.action) in ADMIN_MAKES_STATE else "log"
    if verb in ("usage", "slo") or (verb == "projections" and args.action == "digest"):
        return None if getattr(args, "db", None) else "database"
    return "log"  # rollout, route, fleet, projections status|run, audit, replay


def announce(settings: Settings, args: argparse.Namespace) -> int | None:
    """Says on stderr which home the command uses (when LEDGERLM_HOME is unset); the exit
    status where the command is refused instead, else None."""
    if args.verb in STATELESS or home_is_set(settings):
        return None
    cwd = Path.cwd()  # where the default home is resolved from
    needed = reads(args)
    refused = refusal(settings, needed, cwd) if needed else None
    print(refused or start_line(settings, cwd), file=sys.stderr)
    return 2 if refused else None


def announce_model_tool(argv: list[str]) -> None:
    """`ledgerlm model ...` before it hands over to `python -m workers`: the line, for the
    tools that use the home."""
    if argv[1:2] and argv[1] in MODEL_TOOLS_WITH_STATE:
        try:
            settings = Settings()
        except ValueError:  # a bad setting: the tool itself says which
            return
        if not home_is_set(settings):
            print(start_line(settings, Path.cwd()), file=sys.stderr, flush=True)
