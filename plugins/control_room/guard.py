"""Which requests may change something through the Trainyard view: a check against cross-site
request forgery for its one writing endpoint, the Stop button's `POST …/stop`.

Airflow's UI authenticates the view's requests with its session cookie, which a browser also
sends with a form another site posts to this origin. So a write is taken only from this origin
itself, as the browser vouches for it: `Sec-Fetch-Site: same-origin` where the browser sends
it, and an `Origin` naming this host (every browser sends `Origin` with a POST). A client that
is not a browser (a script) has `trainyard stop` instead. The host compared is the one the
browser asked for (`X-Forwarded-Host` behind a proxy that sets it, else `Host`).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit


def cross_site_problem(headers: Mapping[str, str]) -> str:
    """Why a state-changing request with these (lower-case) headers is refused; '' when it
    comes from this origin."""
    site = headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return f"refused: a {site} request (Sec-Fetch-Site) may not stop a run; use the Stop button of the view"
    origin = headers.get("origin")
    if not origin or origin == "null":
        return "refused: the request names no Origin; use the Stop button of the view, or trainyard stop"
    host = (headers.get("x-forwarded-host") or headers.get("host") or "").split(",")[0].strip().lower()
    if urlsplit(origin).netloc.lower() != host:
        return f"refused: Origin {origin} is not this site ({host or 'no Host header'})"
    return ""
