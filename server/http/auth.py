"""Who may call the API: bearer tokens with a role, the listening address they allow, and the
log line of every control request.

``admin`` may do anything; ``viewer`` may only read (``get``, ``list``, ``position``; ``GET`` on
/v1). A token is known only by its sha256 (``auth.tokens``); a presented token is hashed and
compared with every known hash in constant time. With no token configured the API is open and
the daemon listens on 127.0.0.1 only, unless ``auth.allowAnonymous`` is set (then requests
without a token are served on the configured address as ``anonymous``, an admin: the Go
tool's clients send no token).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from dataclasses import dataclass

from aiohttp import web

from replicator.config.security import AuthSettings
from server.errors import ForbiddenError, UnauthorizedError

log = logging.getLogger(__name__)

ADMIN = "admin"
VIEWER = "viewer"
# Actions a viewer may take; every other action (create, delete, pause, resume, backfill, and
# any added later) needs admin.
READ_ACTIONS = frozenset({"get", "list", "position"})
LOOPBACK = "127.0.0.1"
REALM = 'Bearer realm="milvus-cdc"'


@dataclass(frozen=True)
class Principal:
    name: str
    role: str


ANONYMOUS = Principal("anonymous", ADMIN)


class InvalidTokenError(UnauthorizedError):
    """A token was sent and is none of the configured ones (RFC 6750 ``invalid_token``)."""


class Authenticator:
    def __init__(self, settings: AuthSettings) -> None:
        self._known = [
            (bytes.fromhex(t.sha256), Principal(t.name, t.role)) for t in settings.tokens
        ]
        self.open = not self._known  # no token configured: every request is anonymous
        self.anonymous_allowed = settings.allowAnonymous or self.open
        self.protect_metrics = settings.protectMetrics and not self.open

    def identify(self, header: str | None) -> Principal:
        """The caller named by an ``Authorization`` header; ``UnauthorizedError`` otherwise."""
        if self.open or (header is None and self.anonymous_allowed):
            return ANONYMOUS
        if header is None:
            raise UnauthorizedError("this daemon needs a token: send Authorization: Bearer <token>")
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise UnauthorizedError("Authorization: expected 'Bearer <token>'")
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found = None
        for known, principal in self._known:  # no early exit: the time does not tell which
            if hmac.compare_digest(known, digest):
                found = principal
        if found is None:
            raise InvalidTokenError("the token is not valid")
        return found

    def caller(self, request: web.Request) -> Principal:
        """The caller of ``request``; two ``Authorization`` headers are refused, not chosen
        from."""
        headers = request.headers.getall("Authorization", [])
        if len(headers) > 1 and not self.open:
            raise UnauthorizedError("more than one Authorization header")
        return self.identify(headers[0] if headers else None)

    def authorize(self, request: web.Request, action: str) -> Principal:
        """The caller of ``request``, allowed to take ``action``; 401 or 403 otherwise."""
        principal = self.caller(request)
        permit(principal, action)
        return principal


def permit(principal: Principal, action: str) -> None:
    """403 unless the principal's role may take ``action``."""
    if action not in READ_ACTIONS and principal.role != ADMIN:
        raise ForbiddenError(
            f"token {principal.name!r} has the role {principal.role}; {action} needs admin"
        )


def challenge(exc: BaseException) -> dict[str, str]:
    """The headers a failed request answers with: a 401 names the scheme (RFC 6750)."""
    if not isinstance(exc, UnauthorizedError):
        return {}
    if isinstance(exc, InvalidTokenError):
        return {"WWW-Authenticate": f'{REALM}, error="invalid_token"'}
    return {"WWW-Authenticate": REALM}


def audit(request: web.Request, principal: Principal | None, action: str, status: int) -> None:
    """One line per control request, naming the token (never the token itself); reads are
    logged at DEBUG, refusals at WARNING."""
    who = "unidentified caller" if principal is None else f"{principal.name} ({principal.role})"
    level = logging.INFO
    if status in (401, 403):
        level = logging.WARNING
    elif action in READ_ACTIONS:
        level = logging.DEBUG
    log.log(level, "%s by %s from %s: %d", action, who, request.remote or "-", status)


def listen_host(host: str, settings: AuthSettings) -> str:
    """The address to listen on: the configured one, except 127.0.0.1 for an API without
    tokens that ``allowAnonymous`` does not expose; says so in the log."""
    if settings.tokens:
        if settings.allowAnonymous:
            log.warning(
                "auth.allowAnonymous is true: requests without a token are served as an admin"
            )
        return host
    if settings.allowAnonymous:
        log.warning(
            "no auth.tokens and auth.allowAnonymous is true: the API is unauthenticated on %s",
            host,
        )
        return host
    if _is_loopback(host):
        log.warning(
            "no auth.tokens configured: the API is unauthenticated, listening on %s only", host
        )
        return host
    log.warning(
        "no auth.tokens configured: the API is unauthenticated, so it listens on %s only "
        "(address asks for %s); set auth.tokens, or auth.allowAnonymous: true to expose it",
        LOOPBACK,
        host,
    )
    return LOOPBACK


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
