"""An etcd address as the settings and the clients read it. No etcd client is imported here: the
settings check addresses with it, and a command that only reads settings loads no driver."""

from __future__ import annotations

from urllib.parse import urlsplit


def parse_etcd_address(address: str) -> tuple[str, int, bool]:
    """``http://host:port``, ``https://host:port`` or ``host:port`` -> (host, port, secure)."""
    text = address.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"etcd address {address!r} is not http(s)://host:port")
    try:
        port = parts.port or 2379
    except ValueError as exc:
        raise ValueError(f"etcd address {address!r} has an invalid port") from exc
    return parts.hostname, port, parts.scheme == "https"
