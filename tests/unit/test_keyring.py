"""The key ring and its envelope (metastore/keyring.py); the key file
(replicator/config/secret_keys.py)."""

from __future__ import annotations

import base64
import logging
import os
import stat

import pytest

from metastore.keyring import KeyRing, KeyRingError, SecretUnreadableError, is_sealed
from replicator.config.secret_keys import KeyFile, key_source, write_key_file
from replicator.config.security import SecretsSettings
from replicator.config.settings import ConfigError

SECRET = "Pa55-wörd-✓"


def ring(*ids: str) -> KeyRing:
    return KeyRing(tuple((key_id, os.urandom(32)) for key_id in ids))


def test_seal_and_open_round_trip_bound_to_its_place():
    keys = ring("k1")
    envelope = keys.seal(SECRET, "task t milvus_connect_param.password")
    assert is_sealed(envelope) and envelope["kid"] == "k1"
    assert SECRET not in str(envelope)
    assert keys.open(envelope, "task t milvus_connect_param.password") == SECRET
    assert keys.seal(SECRET, "c")["data"] != keys.seal(SECRET, "c")["data"]  # a fresh nonce
    with pytest.raises(SecretUnreadableError, match="does not decrypt with key 'k1'"):
        keys.open(envelope, "task other milvus_connect_param.password")


def test_open_names_a_missing_key_and_altered_data():
    old, new = ring("old"), ring("new")
    envelope = old.seal(SECRET, "c")
    with pytest.raises(SecretUnreadableError) as missing:
        new.open(envelope, "c")
    assert "key 'old', which is not in this daemon's key ring (it holds new)" in str(missing.value)
    raw = bytearray(base64.b64decode(envelope["data"]))
    raw[-1] ^= 1
    altered = {**envelope, "data": base64.b64encode(bytes(raw)).decode()}
    with pytest.raises(SecretUnreadableError, match="altered"):
        old.open(altered, "c")
    with pytest.raises(SecretUnreadableError, match="altered"):
        old.open({**envelope, "data": "%%%"}, "c")
    with pytest.raises(SecretUnreadableError, match="cannot open"):
        old.open({**envelope, "$sealed": "rot13"}, "c")
    with pytest.raises(SecretUnreadableError, match="no secret key"):
        KeyRing(()).seal(SECRET, "c")


def test_the_first_key_seals_and_every_key_opens():
    both = KeyRing((*ring("new").keys, *ring("old").keys))
    old_only = KeyRing(both.keys[1:])
    assert both.primary == "new" and both.seal("x", "c")["kid"] == "new"
    assert both.open(old_only.seal("x", "c"), "c") == "x"


def test_text_form_parses_back():
    keys = ring("k1", "k2")
    assert KeyRing.parse(keys.text(), "f") == keys
    one_line = ",".join(keys.text().splitlines()[1:])
    assert KeyRing.parse(one_line, "env") == keys


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no-colon", "entry 1 is not <id>:<base64 key>"),
        ("bad id!:AAAA", "entry 1 is not <id>:<base64 key>"),
        ("k1:not base64!", "key 'k1' is not base64"),
        ("k1:" + base64.b64encode(b"short").decode(), "key 'k1' is not 32 bytes"),
        ("k1:{k}\nk1:{k}", "key id 'k1' appears twice"),
    ],
)
def test_bad_key_text_names_the_entry_never_the_key(text, message):
    key = base64.b64encode(os.urandom(32)).decode()
    with pytest.raises(KeyRingError) as refused:
        KeyRing.parse(text.replace("{k}", key), "secrets.keyFile /x")
    assert message in str(refused.value) and key not in str(refused.value)


def test_key_file_is_made_once_with_mode_0600_and_read_again_when_changed(tmp_path, caplog):
    path = tmp_path / "data" / "cdc-secret.key"
    with caplog.at_level(logging.WARNING):
        source = key_source(SecretsSettings(keyFile=str(path)), create=True)
    assert "did not exist: made it with a new key" in caplog.text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = source()
    assert len(first.keys) == 1
    rotated = KeyRing((*ring("next").keys, *first.keys))
    write_key_file(path, rotated)
    assert source() == rotated  # the daemon sees a rotation without a restart
    again = key_source(SecretsSettings(keyFile=str(path)), create=True)
    assert again() == rotated  # an existing file is never replaced


def test_clients_do_not_make_a_key_file_and_env_keys_win(tmp_path):
    path = tmp_path / "none.key"
    assert key_source(SecretsSettings(keyFile=str(path)), create=False)() == KeyRing(())
    assert not path.exists()
    keys = ring("env1")
    text = ",".join(keys.text().splitlines()[1:])
    assert key_source(SecretsSettings(keyFile=str(path), key=text), create=True)() == keys
    assert not path.exists()
    with pytest.raises(ConfigError, match=r"secrets\.key"):
        key_source(SecretsSettings(key="k1:nope"), create=True)


def test_an_unreadable_key_file_stops_the_start_and_later_keeps_the_old_ring(tmp_path):
    path = tmp_path / "k"
    path.write_text("garbage")
    with pytest.raises(ConfigError, match=r"secrets\.keyFile"):
        KeyFile(path)()
    keys = ring("k1")
    write_key_file(path, keys)
    source = KeyFile(path)
    assert source() == keys
    path.write_text("garbage, now")
    assert source() == keys
