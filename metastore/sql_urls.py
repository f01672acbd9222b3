"""The SQL metastore's URL: from a path or the Go tool's DSN, checked, and shown without its
password. No database driver is imported here: the settings check a URL with it (replicator/
config/connections.py), and a command that only reads settings loads no driver."""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

_GO_DSN = re.compile(
    r"^(?P<user>[^:@/]*)(?::(?P<password>.*))?@tcp\((?P<host>[^:)]+)(?::(?P<port>\d+))?\)"
    r"/(?P<db>[^?]*)(?:\?(?P<params>.*))?$"
)


# TLS in a URL's query, as SQLAlchemy hands them to PyMySQL's ``ssl``: PEM files
TLS_FILE_PARAMS = ("ssl_ca", "ssl_cert", "ssl_key")
TLS_PARAMS = (*TLS_FILE_PARAMS, "ssl_capath", "ssl_check_hostname")


def mysql_url_from_source(source: str) -> str:
    """Accept both the Go tool's DSN (``user:pw@tcp(host:port)/db?charset=utf8``) and a
    SQLAlchemy URL (``mysql+pymysql://...``); return a SQLAlchemy URL for PyMySQL.

    TLS: the URL's ``ssl_ca``, ``ssl_cert``, ``ssl_key`` and ``ssl_check_hostname`` (as
    SQLAlchemy reads them); the DSN's ``tls`` (``true``: the system's CAs, ``skip-verify``,
    ``preferred``, ``false``) and, ours, the same ``ssl_*`` files."""
    if "://" in source:
        scheme, rest = source.split("://", 1)
        if scheme not in ("mysql", "mysql+pymysql", "mariadb", "mariadb+pymysql"):
            raise ValueError(f"mysqlSourceUrl: unsupported scheme {scheme!r}, use mysql+pymysql")
        _check_tls_files(parse_qs(urlsplit(source).query))
        return f"mysql+pymysql://{rest}"
    m = _GO_DSN.match(source)
    if m is None:
        raise ValueError(
            "mysqlSourceUrl: expected user:password@tcp(host:port)/database or "
            "mysql+pymysql://user:password@host:port/database"
        )
    user = quote(m["user"] or "", safe="")
    password = m["password"]
    auth = user if password is None else f"{user}:{quote(password, safe='')}"
    port = f":{m['port']}" if m["port"] else ""
    params = {}
    for part in (m["params"] or "").split("&"):
        if "=" in part:
            key, value = part.split("=", 1)
            if key == "charset":
                params["charset"] = "utf8mb4" if value in ("utf8", "utf8mb4") else value
            elif key == "tls":
                params.update(_go_tls(value))
            elif key in TLS_PARAMS:  # ours: the Go driver takes its files in code
                params[key] = quote(unquote(value), safe="/")
    _check_tls_files({k: [unquote(v)] for k, v in params.items()})
    query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
    return f"mysql+pymysql://{auth}@{m['host']}{port}/{m['db']}{query}"


def _go_tls(value: str) -> dict[str, str]:
    """The Go MySQL driver's ``tls`` DSN parameter, as PyMySQL's ``ssl`` settings."""
    if value == "true":  # verified against the system's CAs (PyMySQL verifies only with a CA)
        paths = ssl.get_default_verify_paths()
        return {"ssl_capath": quote(paths.capath or paths.openssl_capath, safe="/")}
    if value == "skip-verify":  # TLS without checking the server's certificate
        return {"ssl_check_hostname": "false"}
    if value == "false":
        return {"ssl_disabled": "true"}
    if value == "preferred":  # PyMySQL's own default: TLS when the server offers it
        return {}
    raise ValueError(
        f"mysqlSourceUrl: tls={value} names a TLS configuration the Go driver registers in "
        "code; give its files as ssl_ca, ssl_cert and ssl_key"
    )


def _check_tls_files(query: dict[str, list[str]]) -> None:
    for key in TLS_FILE_PARAMS:
        for path in query.get(key, []):
            if not Path(path).is_file():
                raise ValueError(f"mysqlSourceUrl: {key}: no such file: {path}")
    if bool(query.get("ssl_cert")) != bool(query.get("ssl_key")):
        raise ValueError("mysqlSourceUrl: ssl_cert and ssl_key go together (mutual TLS)")


def mysql_where(url: str) -> str:
    """Where a SQL metastore is, for messages: ``mysql://host:port/db`` (no user, no
    password), or the SQLite file."""
    if url.startswith("sqlite"):
        return url.removeprefix("sqlite:///")
    parts = urlsplit(url)
    tls = (
        " (TLS)"
        if {"ssl_ca", "ssl_capath", "ssl_check_hostname"} & set(parse_qs(parts.query))
        else ""
    )
    return f"mysql://{parts.netloc.rpartition('@')[2]}{parts.path}{tls}"


def sqlite_url(path: str) -> str:
    Path(path).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{Path(path).expanduser().resolve()}"


__all__ = ["TLS_FILE_PARAMS", "TLS_PARAMS", "mysql_url_from_source", "mysql_where", "sqlite_url"]
