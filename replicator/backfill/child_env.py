"""What of the daemon's environment its Spark drivers (backfill and verify), their JVMs and their
Python workers inherit: an allow-list of the machine's, Java's, Spark's and Python's own
variables, nothing else.

The drivers get the daemon's settings on stdin; no ``CDC_`` variable is passed, whatever it holds
(a whole section such as ``CDC_SECRETS``, ``CDC_METASTORECONFIG``, ``CDC_CLUSTERS`` or
``CDC_AUTH`` holds the key ring or passwords), nor any variable the list does not name (a secret
of another program the daemon was started beside). Spark starts its JVM and its Python workers
with the driver's environment, so the list covers them too.
"""

from __future__ import annotations

from collections.abc import Mapping

# by exact name, any case for the proxy variables (both spellings are in use)
_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "HOSTNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "TMPDIR",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "MALLOC_ARENA_MAX",
        "KRB5CCNAME",
        "KRB5_CONFIG",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
    }
)
# by prefix: locale, Java, Spark (SPARK_HOME, SPARK_CONF_DIR, SPARK_LOCAL_IP ...), PySpark,
# Hadoop and YARN (a cluster's configuration), Python (PYTHONPATH, PYTHONHASHSEED ...), gRPC's
# own settings (the drivers' Milvus clients)
_PREFIXES = ("LC_", "JAVA_", "SPARK_", "PYSPARK_", "HADOOP_", "YARN_", "PYTHON", "GRPC_")


def inherited(name: str) -> bool:
    """Whether a child process of the daemon's may see the variable ``name``."""
    upper = name.upper()
    if upper.startswith("CDC_"):
        return False
    if upper in _NAMES and (name == upper or upper.endswith("_PROXY")):
        return True
    return name == upper and upper.startswith(_PREFIXES)


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` a Spark driver of the daemon's inherits."""
    return {name: value for name, value in environ.items() if inherited(name)}


__all__ = ["child_environment", "inherited"]
