"""What the daemon answers while it starts: its port is bound first (:mod:`server.listen`), then
the metastore opened, the tasks brought back and the start's disaster-recovery round run
(``create_app``'s start-up); meanwhile every request but ``/livez`` answers 503 saying so, in
the envelope of its API, and ``/readyz`` says ``starting``. Nothing is read or changed, so no
token is asked for."""

from __future__ import annotations

from aiohttp import web

from server.http import rest
from server.http.cdc import envelope
from server.http.health import livez

STARTING = (
    "the daemon is starting (opening the metastore, bringing its tasks back, taking up "
    "disaster-recovery jobs); try again in a few seconds"
)
RETRY = {"Retry-After": "2"}


async def starting(request: web.Request) -> web.Response:
    if request.path == "/livez":
        return await livez(request)
    if request.path == "/readyz":
        body = {"status": "starting", "reason": STARTING}
        return web.json_response(body, status=503, headers=RETRY)
    if request.path.startswith(rest.PREFIX + "/"):
        return rest.problem(503, STARTING, RETRY)
    return envelope(503, STARTING, headers=RETRY)


def starting_app() -> web.Application:
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", starting)
    return app
