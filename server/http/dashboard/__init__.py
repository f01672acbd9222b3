"""The dashboard: a static page (HTML, CSS, vanilla JavaScript; no build step) served at ``/``
that polls the /v1 REST resources and pauses, resumes and deletes tasks through them."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).resolve().parent
INDEX = STATIC_DIR / "index.html"


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(INDEX, headers={"Cache-Control": "no-cache"})


def add_dashboard_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_static("/dashboard/", STATIC_DIR, append_version=False)
