"""This release's version (semantic versioning; CHANGELOG.md says what each one changed).

The one place the version is written: ``pyproject.toml`` reads it from here
(``[tool.setuptools.dynamic]``), ``milvus-cdc --version`` and ``/livez`` show it, and fleet
members name it in their heartbeats. The store format this release writes is
``metastore.format.STORE_FORMAT``.
"""

RELEASE = "0.4.0"
