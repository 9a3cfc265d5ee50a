"""`ledgerlm admin ...`: tenants, keys, limits and models, appended to the log as admin
events. Each verb translates its arguments into one `pipelines.admin.commands` command and prints
JSON lines."""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from api.cli.home import not_found
from models.engine_settings import add_engine_flags, given_flags
from models.limits import LIMIT_FIELDS, LIMITS, MAX_FAIR_SHARE_WEIGHT
from models.prices import add_price_flags
from models.quota import Limits
from models.settings import Settings


def _limit_value(text: str) -> int | None:
    if text.lower() in ("none", "unlimited", "-"):
        return None
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("limits are not negative")
    return value


def _pool(text: str) -> str | None:
    return None if text.lower() in ("none", "-", "interactive") else text


def _weight(text: str) -> float | None:
    if text.lower() in ("none", "default", "-"):
        return None
    value = float(text)
    if not 0 < value <= MAX_FAIR_SHARE_WEIGHT:
        raise argparse.ArgumentTypeError(f"a weight is above 0 and at most {MAX_FAIR_SHARE_WEIGHT:g}")
    return value


def _yes_no(text: str) -> bool | None:
    answer = {"yes": True, "true": True, "no": False, "false": False, "none": None, "default": None}.get(text.lower())
    if answer is None and text.lower() not in ("none", "default"):
        raise argparse.ArgumentTypeError("yes or no")
    return answer


# How a flag's text becomes a limit, by the limit's unit (`models.limits`).
UNIT_PARSERS = {"requests": _limit_value, "tokens": _limit_value, "micros": _limit_value, "seconds": _limit_value,
                "weight": _weight, "yes_no": _yes_no, "pool": _pool}


def add_admin_parser(sub) -> None:
    parser = sub.add_parser("admin", help="tenants, keys, limits and models (appended to the log as admin events)")
    what = parser.add_subparsers(dest="what", required=True)
    for add in (_tenant_parser, _key_parser, _limits_parser, _model_parser, _eval_parser, _cache_parser,
                _router_parser):
        add(what)


def _tenant_parser(what) -> None:
    tenant = what.add_parser("tenant").add_subparsers(dest="action", required=True)
    create = tenant.add_parser("create")
    create.add_argument("tenant_id")
    create.add_argument("--name")
    tenant.add_parser("list")
    suspend = tenant.add_parser("suspend", help="refuse its keys (403) and cancel its running work")
    suspend.add_argument("tenant_id")
    suspend.add_argument("--reason")
    tenant.add_parser("reinstate").add_argument("tenant_id")


def _key_parser(what) -> None:
    key = what.add_parser("key").add_subparsers(dest="action", required=True)
    issue = key.add_parser("issue")
    issue.add_argument("--tenant", required=True)
    issue.add_argument("--application", default="default")
    issue.add_argument("--scopes", default="generate,batch,usage")
    issue.add_argument("--expires-at", type=_when, help="an ISO time with its timezone")
    revoke = key.add_parser("revoke")
    revoke.add_argument("key_id")
    rotate = key.add_parser("rotate", help="a new key like this one; this one stays valid a while")
    rotate.add_argument("key_id")
    rotate.add_argument("--old-valid-for-s", type=float, default=3600.0)
    expire = key.add_parser("expire", help="set when a key stops authenticating")
    expire.add_argument("key_id")
    expire.add_argument("--at", type=_when, required=True, help="an ISO time with its timezone")


def _limits_parser(what) -> None:
    limits = what.add_parser("limits").add_subparsers(dest="action", required=True)
    set_ = limits.add_parser("set", help="change some limits; 'none' lifts one")
    set_.add_argument("tenant_id")
    for spec in LIMITS:  # a flag per limit of the catalogue
        set_.add_argument(limit_flag(spec.name), dest=spec.name, type=UNIT_PARSERS[spec.unit],
                          default=argparse.SUPPRESS, help=spec.help)
    limits.add_parser("show").add_argument("tenant_id")


def limit_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _model_parser(what) -> None:
    model = what.add_parser("model").add_subparsers(dest="action", required=True)
    approve = model.add_parser("approve", help="approve a pinned revision and point an alias at it")
    approve.add_argument("--alias", required=True)
    approve.add_argument("--revision", required=True)
    approve.add_argument("--path", required=True)
    approve.add_argument("--config-hash", required=True)
    approve.add_argument("--max-model-len", type=int, required=True)
    add_price_flags(approve)
    approve.add_argument("--tenants", default="*", help="comma-separated tenants allowed, or * for all")
    approve.add_argument("--signature", help="a trusted key's signature over the directory's files "
                                             "(ledgerlm model sign DIR); the digests are read from --path")
    add_engine_flags(approve)  # --config-hash must be the engine's hash with these settings
    alias = model.add_parser("alias", help="point an alias at an approved revision")
    alias.add_argument("alias")
    alias.add_argument("revision")
    alias.add_argument("--tenants", default="*")
    retire = model.add_parser("retire", help="refuse new work on a revision (running work finishes); final")
    retire.add_argument("revision")
    retire.add_argument("--reason")
    model.add_parser("delete-alias", help="remove an alias for every tenant").add_argument("alias")
    model.add_parser("list", help="the approved revisions: aliases, model, config hash, prices, retired or not")


def _eval_parser(what) -> None:
    evals = what.add_parser("eval", help="the eval table: per task and revision, a quality score in [0, 1]") \
        .add_subparsers(dest="action", required=True)
    upload = evals.add_parser("upload", help="record a table's rows (CSV with a header, or JSON lines)")
    upload.add_argument("file", type=Path, help="columns task, model_revision, score[, samples]; - for stdin")
    upload.add_argument("--source", help="the eval run the rows come from (default: the file's name)")
    show = evals.add_parser("show", help="each task and revision's latest score")
    show.add_argument("--task")
    show.add_argument("--revision")


def _cache_parser(what) -> None:
    cache = what.add_parser("cache", help="a tenant's semantic cache per alias (off until turned on)") \
        .add_subparsers(dest="action", required=True)
    policy = cache.add_parser("set", help="turn a tenant's cache for an alias on or off; unset options stay")
    policy.add_argument("tenant_id")
    policy.add_argument("alias")
    policy.add_argument("--off", action="store_true", help="turn it off (default: on)")
    policy.add_argument("--threshold", type=float, help="the similarity a hit needs (at least the platform's floor)")
    policy.add_argument("--ttl-s", type=int, help="how long an answer is served (default 3600)")
    policy.add_argument("--sampled-too", type=_yes_no, help="cache answers sampled above temperature 0: yes or no")
    policy.add_argument("--price-output-per-1k-micros", type=int, help="what a hit costs per 1000 output tokens")
    dead = cache.add_parser("invalidate", help="every answer cached so far for the tenant (and alias) is dead")
    dead.add_argument("tenant_id")
    dead.add_argument("--alias")
    dead.add_argument("--reason")
    cache.add_parser("show", help="the tenant's cache policies").add_argument("tenant_id")


def _router_parser(what) -> None:
    routers = what.add_parser("router", help="router aliases: rules choosing a revision, and fallbacks") \
        .add_subparsers(dest="action", required=True)
    set_router = routers.add_parser("set", help="an alias's rules (a JSON list) and fallback revisions")
    set_router.add_argument("alias")
    set_router.add_argument("--rules", type=Path, help="a JSON file: a list of rules; - for stdin")
    set_router.add_argument("--fallbacks", default="", help="revisions to downgrade to, in order, comma-separated")
    routers.add_parser("show").add_argument("alias")
    routers.add_parser("clear").add_argument("alias")


def run_admin(settings: Settings, args: argparse.Namespace) -> int:
    return print_admin_lines(settings, lambda view, actor: _run(view, args, actor, settings))


def print_admin_lines(settings: Settings, lines) -> int:
    """Prints as JSON lines what `lines(view, actor)` yields over the registry view of the
    configured log; an admin command's refusal is an error line and exit status 2."""
    from pipelines.admin.commands import AdminError, AdminNotFound
    from pipelines.artifacts import ArtifactError
    from pipelines.bootstrap import Bootstrap

    actor = os.environ.get("USER", "cli")
    platform = Bootstrap(settings)
    with platform.event_log() as log:
        view = platform.registry_view(log)
        try:
            for line in lines(view, actor):
                print(json.dumps(line))
        except AdminNotFound as exc:  # perhaps the wrong log: say which one was read
            print(f"error: {not_found(exc, settings)}", file=sys.stderr)
            return 2
        except (AdminError, ArtifactError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


def _when(text: str) -> datetime:
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError("give the time with its timezone, e.g. 2027-01-01T00:00:00Z")
    return when


def _run(view, args, actor: str, settings: Settings):
    """The JSON lines of one verb (a generator: a command's refusal is raised as it is read)."""
    if args.what == "model":
        return _model_lines(view, args, actor, settings)
    lines = {"tenant": _tenant_lines, "key": _key_lines, "limits": _limits_lines, "eval": _eval_lines,
             "cache": _cache_lines, "router": _router_lines}[args.what]
    return lines(view, args, actor)


def _tenant_lines(view, args, actor: str):
    from pipelines.admin import commands as admin
    from pipelines.admin import tenants as admin_tenants

    if args.action == "create":
        admin.create_tenant(view, tenant_id=args.tenant_id, name=args.name or args.tenant_id, actor=actor)
        yield {"tenant_id": args.tenant_id}
    elif args.action == "list":
        registry = view.refresh()
        for tenant in registry.tenants.values():
            yield {"tenant_id": tenant.tenant_id, "name": tenant.name,
                   "limits": registry.limits_for(tenant.tenant_id).as_dict()}
    else:  # suspend, reinstate
        if args.action == "suspend":
            admin_tenants.suspend_tenant(view, tenant_id=args.tenant_id, actor=actor, reason=args.reason)
        else:
            admin_tenants.reinstate_tenant(view, tenant_id=args.tenant_id, actor=actor)
        yield {"tenant_id": args.tenant_id, "suspended": args.action == "suspend"}


def _key_lines(view, args, actor: str):
    from pipelines.admin import commands as admin
    from pipelines.admin import tenants as admin_tenants

    if args.action == "issue":
        secret, env = admin.issue_key(view, tenant_id=args.tenant, actor=actor, application_id=args.application,
                                      scopes=tuple(args.scopes.split(",")), expires_at=args.expires_at)
        yield {"key_id": env.payload.key_id, "api_key": secret, "tenant_id": args.tenant}
    elif args.action == "rotate":
        until = datetime.now(timezone.utc) + timedelta(seconds=args.old_valid_for_s)
        secret, events = admin_tenants.rotate_key(view, key_id=args.key_id, actor=actor, old_valid_until=until)
        yield {"key_id": events[0].payload.key_id, "api_key": secret, "tenant_id": events[0].payload.tenant_id,
               "rotated_from": args.key_id, "old_key_expires_at": view.refresh().expires[args.key_id].isoformat()}
    elif args.action == "expire":
        admin_tenants.set_key_expiry(view, key_id=args.key_id, expires_at=args.at, actor=actor)
        yield {"key_id": args.key_id, "expires_at": args.at.isoformat()}
    else:  # revoke
        admin.revoke_key(view, key_id=args.key_id, actor=actor)
        yield {"revoked": args.key_id}


def _limits_lines(view, args, actor: str):
    from pipelines.admin import commands as admin

    if args.action == "set":
        changes = {name: getattr(args, name) for name in LIMIT_FIELDS if hasattr(args, name)}
        env = admin.set_limits(view, tenant_id=args.tenant_id, actor=actor, **changes)
        yield {"tenant_id": args.tenant_id, **Limits.from_payload(env.payload).as_dict()}
    else:  # show
        registry = view.refresh()
        if args.tenant_id not in registry.tenants:
            raise admin.AdminNotFound(f"tenant {args.tenant_id!r} does not exist")
        yield {"tenant_id": args.tenant_id, **registry.limits_for(args.tenant_id).as_dict()}


def _model_lines(view, args, actor: str, settings: Settings):
    from pipelines import artifacts
    from pipelines.admin import commands as admin

    if args.action == "approve":
        # the directory's files are digested where it is on this machine; elsewhere the
        # revision is approved without them (and a worker serves it unchecked)
        digests = artifacts.artifact_digests(Path(args.path)) if Path(args.path).is_dir() else None
        admin.approve_model(view, alias=args.alias, model_revision=args.revision, model_path=args.path,
                            engine_config_hash=args.config_hash, max_model_len=args.max_model_len, actor=actor,
                            price_input_per_1k_micros=args.price_input_per_1k_micros,
                            price_output_per_1k_micros=args.price_output_per_1k_micros,
                            allowed_tenants=tuple(args.tenants.split(",")), artifact_digests=digests,
                            artifact_signature=args.signature, engine_settings=given_flags(args),
                            **artifacts.approval_policy(settings))
        revision = view.refresh().revisions[args.revision]
        yield {"alias": args.alias, "model_revision": args.revision,
               "engine_settings": revision.engine_settings and revision.engine_settings.model_dump(),
               **artifacts.describe(revision)}
    elif args.action == "list":
        yield from admin.revisions_listed(view.refresh())
    elif args.action == "alias":
        admin.set_alias(view, alias=args.alias, model_revision=args.revision, actor=actor,
                        allowed_tenants=tuple(args.tenants.split(",")))
        yield {"alias": args.alias, "model_revision": args.revision}
    elif args.action == "retire":
        admin.retire_revision(view, model_revision=args.revision, actor=actor, reason=args.reason)
        yield {"model_revision": args.revision, "retired": True}
    else:  # delete-alias
        admin.delete_alias(view, alias=args.alias, actor=actor)
        yield {"alias": args.alias, "deleted": True}


def _router_lines(view, args, actor: str):
    from pipelines.admin import commands as admin
    from pipelines.admin import routers as router_admin

    if args.action == "set":
        rules = []
        if args.rules is not None:
            try:
                rules = json.loads(sys.stdin.read() if str(args.rules) == "-" else args.rules.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise admin.AdminError(f"cannot read rules from {args.rules}: {exc}") from None
            if not isinstance(rules, list):
                raise admin.AdminError("the rules are a JSON list of objects")
        router_admin.set_router(view, alias=args.alias, rules=rules,
                                fallbacks=[f for f in args.fallbacks.split(",") if f], actor=actor)
    elif args.action == "clear":
        router_admin.clear_router(view, alias=args.alias, actor=actor)
        yield {"alias": args.alias, "cleared": True}
        return
    yield router_admin.describe(view.refresh(), args.alias)


def _cache_lines(view, args, actor: str):
    from pipelines.cache import admin as cache_admin

    if args.action == "set":
        env = cache_admin.set_policy(view, tenant_id=args.tenant_id, alias=args.alias, actor=actor,
                                     enabled=not args.off, operator=True, threshold=args.threshold,
                                     ttl_s=args.ttl_s, sampled_too=args.sampled_too,
                                     price_output_per_1k_micros=args.price_output_per_1k_micros)
        yield env.payload.model_dump(exclude={"actor"})
    elif args.action == "invalidate":
        cache_admin.invalidate(view, tenant_id=args.tenant_id, alias=args.alias, actor=actor, reason=args.reason)
        yield {"tenant_id": args.tenant_id, "model_alias": args.alias, "invalidated": True}
    else:
        registry = view.refresh()
        cache_admin.check(registry, args.tenant_id, None)
        yield from cache_admin.policies(registry, args.tenant_id)


def _eval_lines(view, args, actor: str):
    from pipelines.admin import commands as admin
    from pipelines.rollouts import evals

    if args.action == "show":
        yield from evals.table(view.refresh(), task=args.task, model_revision=args.revision)
        return
    try:
        text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise admin.AdminError(f"cannot read {args.file}: {exc}") from None
    source = args.source or ("stdin" if str(args.file) == "-" else args.file.name)
    env = evals.record(view, rows=evals.parse_table(text), source=source, actor=actor)
    yield {"source": source, "rows": len(env.payload.rows), "event_id": str(env.event_id)}
