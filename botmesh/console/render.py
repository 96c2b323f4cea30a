"""HTML pieces of the console: every value that is not the console's own text goes through
:func:`e` (``html.escape``, quotes included), in text and in attributes alike. The page
carries its CSS inline and no script; the counters' chart is inline SVG."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

__all__ = [
    "Row",
    "chart",
    "conceal",
    "e",
    "form",
    "hidden",
    "link",
    "page",
    "table",
    "text_of",
    "when",
]

#: The counters shown in the chart when none is asked for.
DEFAULT_SERIES = ("inboundJournaled", "outboxJournaled", "outboxDead")
_COLOURS = ("#1565c0", "#2e7d32", "#c62828", "#6a1b9a", "#ef6c00", "#00838f")

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#263238;color:#fff;padding:.5em 1em;display:flex;gap:1.5em;align-items:center;
flex-wrap:wrap}
header a{color:#fff}header nav a{margin-right:1em}header form{display:inline}
main{padding:1em}h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse;margin:.5em 0;background:#fff}
th,td{border:1px solid #ccd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#eceff1}td.n{text-align:right;font-variant-numeric:tabular-nums}
.banner{background:#fff3cd;border:1px solid #e0c060;padding:.5em 1em;margin:0}
.progress{color:#555;font-size:.9em;margin:.5em 1em}
.error{background:#fdecea;border:1px solid #e57373;padding:.5em 1em}
.ok{background:#e8f5e9;border:1px solid #81c784;padding:.5em 1em}
.hidden{color:#777;font-style:italic}.state-sent,.state-done{color:#2e7d32}
.state-dead,.state-refused,.state-failed{color:#c62828}.state-unknown{color:#ef6c00}
.state-cancelled{color:#546e7a}.state-pending{color:#1565c0}
.bar{display:inline-block;width:12em;height:.9em;background:#eceff1;border:1px solid #ccd;
vertical-align:middle;overflow:hidden;white-space:nowrap;line-height:0}
.bar span{display:inline-block;height:100%}.bar-sent{background:#2e7d32}
.bar-dead{background:#c62828}.bar-expired{background:#ad1457}.bar-unknown{background:#ef6c00}
.bar-cancelled{background:#90a4ae}td.meter{white-space:nowrap}
.entry{background:#fff;border:1px solid #ccd;margin:.5em 0;padding:.5em}
.entry .sends{margin-left:1.5em}pre{white-space:pre-wrap;word-break:break-all;margin:0}
form.inline{display:inline}label{margin-right:1em}
"""

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def e(value: object) -> str:
    """``value`` as HTML text (``None``: empty), escaped."""
    return "" if value is None else html.escape(str(value), quote=True)


def when(ts: float | None) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SS.mmm`` UTC (``-`` when unknown)."""
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def text_of(text: str | None, show: bool) -> str:
    """A message text: escaped with ``show``, else ``hidden (N chars)``."""
    if text is None:
        return '<span class="hidden">no text</span>'
    if show:
        return f'<span data-testid="entry-text">{e(text)}</span>'
    return f'<span class="hidden" data-testid="entry-text">hidden ({len(text)} chars)</span>'


_SECRET_KEYS = frozenset({"text", "data", "args", "result", "answers"})


def conceal(value: Any) -> Any:
    """``value`` (JSON) with the strings under the keys that hold what people wrote
    (``text``, a flow's ``data``…) replaced by ``hidden (N chars)``."""
    if isinstance(value, Mapping):
        return {k: (_hide(v) if k in _SECRET_KEYS else conceal(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [conceal(v) for v in value]
    return value


def _hide(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        return f"hidden ({len(value)} chars)"
    return f"hidden ({len(json.dumps(value, ensure_ascii=False))} chars of JSON)"


def hidden(name: str, value: object) -> str:
    return f'<input type="hidden" name="{e(name)}" value="{e(value)}">'


def form(
    action: str,
    body: str,
    *,
    method: str = "post",
    csrf: str | None = None,
    testid: str | None = None,
    inline: bool = False,
) -> str:
    """A form; a POST form carries the session's CSRF token."""
    token = hidden("csrf", csrf) if method == "post" and csrf is not None else ""
    tid = f' data-testid="{e(testid)}"' if testid else ""
    cls = ' class="inline"' if inline else ""
    return f'<form method="{method}" action="{e(action)}"{tid}{cls}>{token}{body}</form>'


#: A table row: its cells, each its HTML (escaped already) or (HTML, ``<td>`` attributes),
#: and the ``<tr>`` attributes.
Row = tuple[Sequence[Any], Mapping[str, Any]]


def table(
    head: Sequence[str],
    rows: Iterable[Row],
    *,
    testid: str | None = None,
    empty: str = "none",
) -> str:
    """A table; each row is its cells (HTML, or (HTML, attributes)) and its ``<tr>``
    attributes (``data-testid``, ``data-*``: escaped here)."""
    out = [f"<table{_attrs({'data-testid': testid})}><tr>"]
    out += [f"<th>{e(h)}</th>" for h in head]
    out.append("</tr>")
    n = 0
    for cells, attrs in rows:
        n += 1
        out.append(f"<tr{_attrs(attrs)}>")
        for cell in cells:
            html_, cell_attrs = (cell, {}) if isinstance(cell, str) else cell
            assert isinstance(html_, str)
            out.append(f"<td{_attrs(cell_attrs)}>{html_}</td>")
        out.append("</tr>")
    if not n:
        out.append(f'<tr><td colspan="{len(head)}" class="hidden">{e(empty)}</td></tr>')
    out.append("</table>")
    return "".join(out)


def _attrs(attrs: Mapping[str, object]) -> str:
    return "".join(f' {e(k)}="{e(v)}"' for k, v in attrs.items() if v is not None)


def link(path: str, params: Mapping[str, object] | None = None) -> str:
    """``path?params`` (empty values left out), for an ``href`` (escape it there)."""
    query = urlencode({k: v for k, v in (params or {}).items() if v not in (None, "")})
    return f"{path}?{query}" if query else path


def chart(series: Mapping[str, Sequence[tuple[float, int]]], *, width: int = 720) -> str:
    """An SVG line chart of ``series`` (name -> (time, value) points, time ascending)."""
    height, pad = 220, 40
    points = [p for pts in series.values() for p in pts]
    if not points:
        return (
            '<p class="hidden" data-testid="counters-chart">no counters read yet: the workers '
            "publish them every BOTMESH_METRICS_INTERVAL seconds</p>"
        )
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    top = max([1, *(p[1] for p in points)])
    span = max(t1 - t0, 1e-9)

    def xy(t: float, v: int) -> str:
        x = pad + (t - t0) / span * (width - 2 * pad)
        y = height - pad - v / top * (height - 2 * pad)
        return f"{x:.1f},{y:.1f}"

    out = [
        f'<svg data-testid="counters-chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="the counters over time" '
        'xmlns="http://www.w3.org/2000/svg" style="background:#fff;border:1px solid #ccd">',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="#999"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#999"/>',
        f'<text x="4" y="{pad + 4}" font-size="11">{top}</text>',
        f'<text x="4" y="{height - pad}" font-size="11">0</text>',
        f'<text x="{pad}" y="{height - 8}" font-size="11">{e(when(t0))}</text>',
        f'<text x="{width - pad}" y="{height - 8}" font-size="11" text-anchor="end">'
        f"{e(when(t1))}</text>",
    ]
    for i, (name, pts) in enumerate(series.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        line = " ".join(xy(t, v) for t, v in pts)
        out.append(
            f'<polyline data-testid="counter-series" data-counter="{e(name)}" fill="none" '
            f'stroke="{colour}" stroke-width="2" points="{line}"/>'
        )
        out.append(
            f'<text x="{pad + 8}" y="{pad + 14 * (i + 1)}" font-size="12" fill="{colour}">'
            f"{e(name)} ({pts[-1][1]})</text>"
        )
    out.append("</svg>")
    return "".join(out)


def page(
    title: str,
    body: str,
    *,
    nav: str,
    banner: str = "",
    progress: str = "",
) -> str:
    """A whole page: the header (navigation, who is signed in), the read-only banner, how
    far the index has read, then ``body``."""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{e(title)} · botmesh console</title><style>{CSS}</style></head><body>"
        f"<header>{nav}</header>{banner}{progress}<main><h1>{e(title)}</h1>{body}</main>"
        "</body></html>"
    )
