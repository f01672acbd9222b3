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
# ours: the server's certificate is not verified, asked by name (``tls=skip-verify`` in the Go
# DSN says the same); taken out of the URL before SQLAlchemy reads it (sql_engine.py)
INSECURE_PARAM = "insecure_skip_verify"
TLS_PARAMS = (*TLS_FILE_PARAMS, "ssl_capath", "ssl_check_hostname", INSECURE_PARAM)


def mysql_url_from_source(source: str) -> str:
    """Accept both the Go tool's DSN (``user:pw@tcp(host:port)/db?charset=utf8``) and a
    SQLAlchemy URL (``mysql+pymysql://...``); return a SQLAlchemy URL for PyMySQL.

    TLS: the URL's ``ssl_ca``, ``ssl_cert``, ``ssl_key`` and ``ssl_check_hostname`` (as
    SQLAlchemy reads them); the DSN's ``tls`` (``true``: the system's CAs, ``skip-verify``,
    ``preferred``, ``false``) and, ours, the same ``ssl_*`` files. Without a CA the server is
    verified against the system's CAs, unless ``insecure_skip_verify=true`` (or the DSN's
    ``tls=skip-verify``) says otherwise by name."""
    if "://" in source:
        scheme, rest = source.split("://", 1)
        if scheme not in ("mysql", "mysql+pymysql", "mariadb", "mariadb+pymysql"):
            raise ValueError(f"mysqlSourceUrl: unsupported scheme {scheme!r}, use mysql+pymysql")
        parts = urlsplit(source)
        given = parse_qs(parts.query)
        _check_tls_files(given)
        extra = _verification(given)
        joined = "&".join(f"{k}={v}" for k, v in extra.items())
        sep = "&" if parts.query else "?"
        return f"mysql+pymysql://{rest}" + (f"{sep}{joined}" if joined else "")
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
    query_lists = {k: [unquote(v)] for k, v in params.items()}
    _check_tls_files(query_lists)
    params.update(_verification(query_lists))
    query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
    return f"mysql+pymysql://{auth}@{m['host']}{port}/{m['db']}{query}"


def _go_tls(value: str) -> dict[str, str]:
    """The Go MySQL driver's ``tls`` DSN parameter, as PyMySQL's ``ssl`` settings."""
    if value == "true":  # verified against the system's CAs (PyMySQL verifies only with a CA)
        return _system_store()
    if value == "skip-verify":  # TLS without checking the server's certificate, asked by name
        return {"ssl_check_hostname": "false", INSECURE_PARAM: "true"}
    if value == "false":
        return {"ssl_disabled": "true"}
    if value == "preferred":  # PyMySQL's own default: TLS when the server offers it
        return {}
    raise ValueError(
        f"mysqlSourceUrl: tls={value} names a TLS configuration the Go driver registers in "
        "code; give its files as ssl_ca, ssl_cert and ssl_key"
    )


def _system_store() -> dict[str, str]:
    paths = ssl.get_default_verify_paths()
    return {"ssl_capath": quote(paths.capath or paths.openssl_capath, safe="/")}


def _verification(query: dict[str, list[str]]) -> dict[str, str]:
    """What to add to TLS settings without a CA so that the server's certificate is verified
    against the system's CAs, as etcd, Kafka and Pulsar do: PyMySQL verifies nothing without a
    CA (``CERT_NONE``, no host name check), so a client certificate alone would send the
    password to whoever poses as the server. Nothing when a CA is given, TLS is not asked, or
    verification is turned off by name (``insecure_skip_verify=true``)."""
    if insecure(query):
        if query.get("ssl_ca") or query.get("ssl_capath"):
            raise ValueError(
                f"mysqlSourceUrl: {INSECURE_PARAM}=true turns off the verification that ssl_ca "
                "or ssl_capath asks for: give one or the other"
            )
        return {"ssl_check_hostname": "false"} if not query.get("ssl_check_hostname") else {}
    asked = any(query.get(k) for k in ("ssl_cert", "ssl_key", "ssl_check_hostname"))
    if asked and not (query.get("ssl_ca") or query.get("ssl_capath")):
        return _system_store()
    return {}


def insecure(query: dict[str, list[str]]) -> bool:
    """Whether a URL's query turns the verification of the server's certificate off."""
    values = query.get(INSECURE_PARAM) or []
    bad = [v for v in values if v.lower() not in ("true", "false")]
    if bad:
        raise ValueError(f"mysqlSourceUrl: {INSECURE_PARAM}={bad[0]}: expected true or false")
    return any(v.lower() == "true" for v in values)


def url_is_insecure(url: str) -> bool:
    """Whether a URL of ``mysql_url_from_source`` connects without verifying the server."""
    return not url.startswith("sqlite") and insecure(parse_qs(urlsplit(url).query))


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
    query = parse_qs(parts.query)
    tls = " (TLS)" if {"ssl_ca", "ssl_capath", "ssl_check_hostname"} & set(query) else ""
    if insecure(query):
        tls = " (TLS, server not verified)"
    return f"mysql://{parts.netloc.rpartition('@')[2]}{parts.path}{tls}"


def sqlite_url(path: str) -> str:
    Path(path).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{Path(path).expanduser().resolve()}"


__all__ = [
    "INSECURE_PARAM",
    "TLS_FILE_PARAMS",
    "TLS_PARAMS",
    "mysql_url_from_source",
    "mysql_where",
    "sqlite_url",
    "url_is_insecure",
]
