"""Sessions, sign-in and CSRF protection.

Every visitor gets a session (a random token in an HttpOnly, SameSite=Strict cookie) holding a CSRF token; every
request that changes state (any method but GET/HEAD) must carry that token, as the form field ``csrf`` or the
header ``X-CSRF-Token``. With ACL on, a session is signed in with an account's access and secret key once an admin
request signed with them succeeds at a broker: the brokers decide who is an admin, the dashboard only remembers
who signed in (the secret stays in this process's memory, to sign that session's requests)."""
from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

from aiohttp import web

from halfmq.client.remoting import Credentials

COOKIE = "halfmq_session"
MAX_SESSIONS = 10_000  #: sessions kept at once: a client that never sends its cookie back cannot grow this


@dataclass
class Session:
    token: str
    csrf: str
    expires: float
    credentials: Credentials | None = None  #: signed in (ACL on)
    access_key: str = ""
    data: dict = field(default_factory=dict)


class Sessions:
    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self.by_token: dict[str, Session] = {}

    def get(self, token: str | None) -> Session | None:
        session = self.by_token.get(token or "")
        if session is None:
            return None
        if session.expires < time.monotonic():
            del self.by_token[session.token]
            return None
        session.expires = time.monotonic() + self.ttl_s
        return session

    def new(self) -> Session:
        if len(self.by_token) >= MAX_SESSIONS:
            self.expire()
            if len(self.by_token) >= MAX_SESSIONS:  # still full: the longest idle session goes
                del self.by_token[min(self.by_token.values(), key=lambda s: s.expires).token]
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), time.monotonic() + self.ttl_s)
        self.by_token[session.token] = session
        return session

    def expire(self) -> None:
        now = time.monotonic()
        for token in [t for t, s in self.by_token.items() if s.expires < now]:
            del self.by_token[token]

    def end(self, session: Session) -> None:
        self.by_token.pop(session.token, None)


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def csrf_ok(request: web.Request, session: Session, form_token: str | None) -> bool:
    sent = request.headers.get("X-CSRF-Token") or form_token or ""
    return hmac.compare_digest(sent.encode(), session.csrf.encode())


class LoginFailures:
    """Failed sign-ins per client address: after ``limit`` within ``window_s`` that address is refused until the
    window has passed, so a secret key cannot be guessed at the speed of the brokers' answers (each try costs them
    an admin request). Bounded: the least recently failing addresses are forgotten first."""

    def __init__(self, limit: int = 5, window_s: float = 60.0, max_hosts: int = 10_000):
        self.limit, self.window_s, self.max_hosts = limit, window_s, max_hosts
        self.by_host: dict[str, list[float]] = {}

    def _recent(self, host: str) -> list[float]:
        cutoff = time.monotonic() - self.window_s
        times = [t for t in self.by_host.get(host, ()) if t > cutoff]
        if times:
            self.by_host[host] = times
        else:
            self.by_host.pop(host, None)
        return times

    def refused(self, host: str) -> bool:
        return len(self._recent(host)) >= self.limit

    def failed(self, host: str) -> None:
        times = self._recent(host)
        self.by_host.pop(host, None)  # re-inserted last: dict order is least recently failing first
        self.by_host[host] = times + [time.monotonic()]
        while len(self.by_host) > self.max_hosts:
            del self.by_host[next(iter(self.by_host))]

