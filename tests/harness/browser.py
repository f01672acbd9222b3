"""A headless Chromium (Debian's ``chromium``) driven over the Chrome DevTools Protocol with
aiohttp's websocket client: open a page, evaluate JavaScript, click like a mouse, screenshot.

Chromium is started with ``--remote-debugging-port=0`` and writes the port it chose to
``DevToolsActivePort`` in its profile directory; one browser-level websocket carries every
command, pages are attached in "flat" mode (commands carry a ``sessionId``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from harness.services import MissingBinaryError, die_with_parent, stop_process

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
]


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise MissingBinaryError("chromium not found (apt-get install -y chromium)")
    return found


class CdpError(Exception):
    pass


@dataclass
class Browser:
    ws: aiohttp.ClientWebSocketResponse
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _waiting: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    _listeners: list[tuple[str, str | None, asyncio.Queue[dict[str, Any]]]] = field(
        default_factory=list
    )
    exceptions: list[str] = field(default_factory=list)

    async def read_loop(self) -> None:
        async for message in self.ws:
            if message.type is not aiohttp.WSMsgType.TEXT:
                break
            data = message.json()
            if "id" in data:
                future = self._waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    if "error" in data:
                        future.set_exception(CdpError(str(data["error"])))
                    else:
                        future.set_result(data.get("result", {}))
                continue
            method = data.get("method", "")
            if method == "Runtime.exceptionThrown":
                details = data["params"]["exceptionDetails"]
                self.exceptions.append(
                    details.get("exception", {}).get("description") or details.get("text", "")
                )
            for wanted, session, queue in self._listeners:
                if wanted == method and session in (None, data.get("sessionId")):
                    queue.put_nowait(data.get("params", {}))

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        message_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[message_id] = future
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        await self.ws.send_json(message)
        return dict(await asyncio.wait_for(future, timeout=30))

    def listen(self, method: str, session: str | None = None) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._listeners.append((method, session, queue))
        return queue

    async def new_page(self, width: int = 1280, height: int = 800) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, attached["sessionId"], width, height)
        for domain in ("Page", "Runtime"):
            await page.send(f"{domain}.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return page


@dataclass
class Page:
    browser: Browser
    session: str
    width: int
    height: int

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, self.session)

    async def goto(self, url: str) -> None:
        loaded = self.browser.listen("Page.loadEventFired", self.session)
        answer = await self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise CdpError(f"{url}: {answer['errorText']}")
        await asyncio.wait_for(loaded.get(), timeout=30)

    async def open_dashboard(self, url: str, token: str | None = None) -> None:
        """The daemon's dashboard at ``url``, signed in with ``token`` (kept in the tab's
        sessionStorage, as the page's own form does)."""
        if token:
            # set on a page of the same origin that runs no script (/livez): on the dashboard
            # itself, its first request (sent without a token, answered 401) could clear the
            # token after it was set
            await self.goto(url + "/livez")
            await self.evaluate(f"sessionStorage.setItem('milvus-cdc-token', {json.dumps(token)})")
        await self.goto(url + "/")

    async def evaluate(self, expression: str) -> Any:
        answer = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in answer:
            raise CdpError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def wait_for(self, expression: str, within: float = 15) -> Any:
        """Evaluate until the value is truthy; returns it."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"still falsy after {within} s: {expression}")
            await asyncio.sleep(0.1)

    async def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the middle of the element."""
        box = await self.evaluate(
            f"(() => {{ const e = document.querySelector({selector!r});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return {x: r.x + r.width / 2, y: r.y + r.height / 2}; })()"
        )
        if box is None:
            raise CdpError(f"no element matches {selector}")
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box["x"], "y": box["y"], "button": "left", "clickCount": 1},
            )

    async def screenshot(self, path: Path) -> bytes:
        answer = await self.send("Page.captureScreenshot", {"format": "png"})
        data = base64.b64decode(answer["data"])
        await asyncio.to_thread(path.write_bytes, data)
        return data


def _launch(profile: Path, log_path: Path, scratch: Path) -> subprocess.Popen[bytes]:
    """``scratch``: its temporary directory (a short path: chromium makes sockets there)."""
    profile.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            die_with_parent([chromium_binary(), *FLAGS, f"--user-data-dir={profile}"]),
            env={**os.environ, "TMPDIR": str(scratch)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextlib.asynccontextmanager
async def chromium(workdir: Path) -> AsyncIterator[Browser]:
    profile = workdir / "profile"
    log_path = workdir / "chromium.log"
    # its org.chromium.Chromium.* files go here and with it (a killed chromium left them in /tmp)
    scratch = Path(tempfile.mkdtemp(prefix="cdc-chromium-"))
    process = _launch(profile, log_path, scratch)
    try:
        port_file = profile / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and len(port_file.read_text().splitlines()) >= 2:
                break
            if process.poll() is not None:
                raise CdpError(f"chromium exited: {log_path.read_text()[-2000:]}")
            await asyncio.sleep(0.1)
        else:
            raise CdpError(f"chromium wrote no DevToolsActivePort: {log_path.read_text()[-2000:]}")
        port, ws_path = port_file.read_text().splitlines()[:2]
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"ws://127.0.0.1:{port}{ws_path}", max_msg_size=0) as ws,
        ):
            browser = Browser(ws)
            reader = asyncio.create_task(browser.read_loop())
            try:
                yield browser
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
    finally:
        stop_process(process, grace=5)
        shutil.rmtree(scratch, ignore_errors=True)


# --- PNG reading (enough to check a screenshot) --------------------------------------------------
@dataclass(frozen=True)
class Png:
    width: int
    height: int
    pixels: list[bytes]  # one row of RGBA bytes each

    def colours(self) -> set[bytes]:
        return {row[i : i + 4] for row in self.pixels for i in range(0, len(row), 4)}


def read_png(data: bytes) -> Png:
    """Decode an 8-bit RGB(A) PNG; every chunk's CRC is checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    offset, idat, header = 8, b"", b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        offset += 12 + length
        if kind == b"IEND":
            break
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6), f"unsupported PNG: depth {depth}, colour {colour}"
    step = 4 if colour == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * step
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        _unfilter(kind, line, previous, step)
        rows.append(bytes(line) if step == 4 else _rgba(line))
        previous = line
    return Png(width, height, rows)


def _unfilter(kind: int, line: bytearray, prior: bytearray, step: int) -> None:
    if kind == 0:
        return
    if kind == 2:
        line[:] = bytes((a + b) & 0xFF for a, b in zip(line, prior, strict=True))
        return
    for i in range(len(line)):
        left = line[i - step] if i >= step else 0
        up = prior[i]
        if kind == 1:
            line[i] = (line[i] + left) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (left + up) // 2) & 0xFF
        else:
            corner = prior[i - step] if i >= step else 0
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            pred = left if pa <= pb and pa <= pc else up if pb <= pc else corner
            line[i] = (line[i] + pred) & 0xFF


def _rgba(line: bytearray) -> bytes:
    return b"".join(bytes(line[i : i + 3]) + b"\xff" for i in range(0, len(line), 3))
