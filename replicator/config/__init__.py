"""The daemon's configuration (``cdc.yaml`` and ``CDC_*``), and the stores and keys it opens.

Configuration lives here, below both the replication engine (``replicator/``) and the daemon
(``server/``): both read it, so ``replicator/`` never has to import ``server/``. Nothing in this
package imports ``server/``. Import from the modules:

- :mod:`settings`: the root ``CdcSettings``, reading the file and the environment
  (``load_settings``), ``ConfigError``, and the keys the daemon accepts but does not use.
- :mod:`section`: ``ConfigSection``, the base of every section (unknown keys are errors).
- :mod:`connections`: etcd, the metastore and a source cluster (its queue, etcd and Milvus).
- :mod:`daemon`: periodic jobs and retries, backfill and verify, the fleet, memory.
- :mod:`security`: API tokens, TLS, and the key ring that seals the secrets of tasks.
- :mod:`redaction`: the configuration shown without its secrets, the secrets for the log's
  redactor, and the secret ``CDC_*`` variables removed from the environment.
- :mod:`stores`: the configured metastore opened.
- :mod:`secret_keys`: where the secret keys come from, and the task store that uses them.
"""

__all__: list[str] = []
