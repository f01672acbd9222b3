"""``milvus-cdc secrets rotate``: encrypt every stored secret with a new key.

1. A new key is put first in ``secrets.keyFile``, the old ones after it: from then on every
   daemon (they read the file again when it changes) encrypts with the new key and still reads
   the old one. A file that lacks a key the metastore's secrets are encrypted with is left as
   it is, and nothing is rotated.
2. Every secret in the metastore (the tasks' passwords and tokens, WAL-switch records) sealed
   with another key, or stored in clear, is encrypted with the new key; a second pass catches
   values a daemon wrote meanwhile.
3. The old keys are removed from the file (``--keep-old`` keeps them), unless a value could not
   be read: then they stay, and the values are named.

A key ring given in ``secrets.key`` (``CDC_SECRETS__KEY``) cannot be rewritten by this command.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from metastore import MetaStoreError
from metastore.keyring import KeyRing
from metastore.sealed import ResealReport
from replicator.config.secret_keys import KeyFile, open_task_store, write_key_file
from replicator.config.settings import CdcSettings
from server.cli.client import CliError


def run_secrets_command(args: argparse.Namespace, settings: CdcSettings, out: TextIO) -> int:
    if settings.secrets.key.get_secret_value():
        raise CliError(
            "secrets.key (CDC_SECRETS__KEY) holds the key ring, which this command cannot "
            "rewrite: rotate with a key file (secrets.keyFile), or put a new key first in "
            "secrets.key, restart the daemons, and run this command with that ring"
        )
    path = Path(settings.secrets.keyFile).expanduser()
    if not path.exists():
        raise CliError(
            f"secrets.keyFile {path} does not exist: nothing to rotate (the daemon makes it "
            "on its first start)"
        )
    old = KeyFile(path)()
    try:
        store = open_task_store(settings)
    except MetaStoreError as exc:
        raise CliError(f"cannot open the metastore: {exc} (the key file is unchanged)") from None
    try:
        missing = store.missing_keys()
    except MetaStoreError as exc:
        store.close()
        raise CliError(f"cannot read the metastore: {exc} (the key file is unchanged)") from None
    if missing is not None:  # sealing with a new key would lock the owners of those keys out
        store.close()
        raise CliError(f"{missing}: nothing rotated, the key file {path} is unchanged")
    new = KeyRing.new_key()
    write_key_file(path, KeyRing((new, *old.keys)))
    try:
        first = store.reseal()
        second = store.reseal()  # written by a daemon before it read the new file
    except MetaStoreError as exc:
        raise CliError(f"rotation stopped: {exc}; run it again") from None
    finally:
        store.close()
    done = ResealReport(first.sealed + second.sealed, first.tasks | second.tasks)
    print(
        f"new key {new[0]}: {done.sealed} secret(s) of {len(done.tasks)} task(s) encrypted with it",
        file=out,
    )
    if second.unreadable:
        for problem in second.unreadable:
            print(f"not readable, left as it is: {problem}", file=out)
        print(f"old keys kept in {path}: {', '.join(old.ids)}", file=out)
        return 1
    if args.keep_old or not old.keys:
        print(f"old keys kept in {path}: {', '.join(old.ids) or 'none'}", file=out)
        return 0
    write_key_file(path, KeyRing((new,)))
    print(f"old keys removed from {path}: {', '.join(old.ids)}", file=out)
    return 0
