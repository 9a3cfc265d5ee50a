"""Pages: Jinja2 templates (autoescaped), number formats, and bar charts drawn as inline
SVG on the server, so a page is one HTML response and a stylesheet, with no script."""
from __future__ import annotations

from datetime import date, datetime, timezone
from functools import cache
from pathlib import Path

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape

HERE = Path(__file__).parent
# No script, no inline style, nothing from elsewhere: a page cannot be made to run code.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin", "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def micros(value: int | None) -> str:
    """Micro-units as a decimal, exactly (no float ever touches money)."""
    if value is None:
        return "—"
    sign, value = ("-" if value < 0 else ""), abs(int(value))
    return f"{sign}{value // 1_000_000:,}.{value % 1_000_000:06d}"


def count(value: int | float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def bar_chart(series: list[tuple[str, int]], *, title: str, unit=micros, width: int = 720,
              height: int = 180) -> Markup:
    """A bar per (label, value), drawn as SVG; labels are escaped, every bar has a tooltip."""
    if not series:
        return Markup(f'<p class="empty">No {escape(title.lower())} in this range.</p>')
    top = max(v for _, v in series) or 1
    pad, base = 4, height - 22
    slot = (width - 2 * pad) / len(series)
    bar = max(1.0, slot * 0.8)
    parts = [f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="100%" height="{height}" '
             f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
             f'<line x1="0" y1="{base}" x2="{width}" y2="{base}" stroke="#999" stroke-width="1"/>']
    every = max(1, len(series) // 8)  # at most about eight labels under the axis
    for i, (label, value) in enumerate(series):
        h = (base - 10) * max(0, value) / top
        x = pad + i * slot + (slot - bar) / 2
        parts.append(f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="#3a6ea5">'
                     f'<title>{escape(label)}: {escape(unit(value))}</title></rect>')
        if i % every == 0:
            parts.append(f'<text x="{x:.1f}" y="{height - 6}" font-size="10" fill="#444">{escape(label)}</text>')
    parts.append(f'<text x="{width - pad}" y="12" font-size="10" fill="#444" text-anchor="end">'
                 f'max {escape(unit(top))}</text></svg>')
    return Markup("".join(parts))


@cache
def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(micros=micros, count=count, when=when)
    return env


def page(request: Request, template: str, *, user=None, status_code: int = 200, **context) -> HTMLResponse:
    ctx = {"user": user, "request": request, "today": date.today(), **context}
    if user is not None:
        ctx.setdefault("notices", user.session.take_notices())
        ctx["csrf"] = user.session.csrf
        ctx["tenants"] = sorted(user.registry.tenants) if user.operator else [user.actor.tenant_id]
    html = environment().get_template(template).render(**ctx)
    return HTMLResponse(html, status_code=status_code, headers=HEADERS)
