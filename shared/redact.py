"""Credentials out of what we log or show: one helper for every URL a log line, an error or ``/status`` carries.

``redis://:secret@host:6379/0`` is shown as ``redis://:***@host:6379/0``; a user name stays (it is not a
secret), a password never does. Anything that is not a URL with credentials comes back unchanged, so it is safe
to call on every URL-ish string before it is logged.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
# scheme://[user][:password]@ anywhere in a text (an exception message that quotes a URL, say)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<password>[^@/\s]+)@")


def redact_url(url: str | None) -> str | None:
    """``url`` with its password (if any) replaced by ``***``; None stays None."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:{MASK}@{host}"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redact_text(text: str) -> str:
    """Every ``scheme://user:password@`` in ``text`` with the password replaced (for error messages)."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
