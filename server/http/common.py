"""What ``POST /cdc`` and the ``/v1`` resources share: reading a JSON body, turning a failure
into a status and a message, and the views of positions."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from metastore import MetaStoreError, MetaStoreUnavailableError, Position
from metastore.sealed import KeysMissingError
from replicator.hybrid_time import physical_ms
from server.errors import ApiError, BadRequestError, PayloadTooLargeError

log = logging.getLogger(__name__)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: web.Request, limit: int) -> Any:
    """The request body parsed as strict JSON (no NaN or Infinity); 413 above ``limit``."""
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLargeError(
            f"request body is larger than the limit of {limit} bytes (maxRequestBytes)"
        ) from exc
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}") from exc


def failure_answer(exc: Exception, action: str) -> tuple[int, str]:
    """The status and message a failed request answers with; unexpected errors are logged
    with their traceback and answered without details."""
    if isinstance(exc, ApiError):
        return exc.status, exc.message
    if isinstance(exc, KeysMissingError):  # this daemon is not ready: another one may serve
        return 503, str(exc)
    if isinstance(exc, MetaStoreUnavailableError):
        log.warning("metastore unavailable during %s: %s", action, exc)
        return 503, f"metastore unavailable, try again: {exc}"
    if isinstance(exc, MetaStoreError):
        log.error("metastore error during %s: %s", action, exc)
        return 500, f"metastore error: {exc}"
    log.error("internal error while handling %s", action, exc_info=exc)
    return 500, f"internal error while handling {action}; see the daemon log"


def positions_view(positions: Iterable[Position]) -> list[dict[str, Any]]:
    """Saved positions as the API shows them, by channel name."""
    return [
        {
            "channel_name": p.pchannel,
            "backend": p.backend,
            "msg_id": base64.b64encode(p.msg_id).decode(),
            "tt": p.ts,
            "time": physical_ms(p.ts),  # milliseconds
        }
        for p in sorted(positions, key=lambda p: p.pchannel)
    ]
