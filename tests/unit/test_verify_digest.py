"""The verify digest: one hash per row whatever the order of its fields, one digest per set of
rows whatever the order of the rows, and any change of a stored value changes it."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from replicator.compare.digest import MOD, Digest, digest_hashes, digest_rows, encode_row, row_hash

KINDS = {
    "key": "VARCHAR",
    "id": "INT64",
    "vec": "FLOAT_VECTOR",
    "bin": "BINARY_VECTOR",
    "sparse": "SPARSE_FLOAT_VECTOR",
    "f": "FLOAT",
    "d": "DOUBLE",
    "flag": "BOOL",
    "doc": "JSON",
    "tags": "ARRAY",
}

AWKWARD_KEYS = ['a"b', "back\\slash", "with space", " lead", "trail ", "ünïcødé-键-🙂", "", "'"]


def row(key: str, seed: int = 0) -> dict:
    rnd = random.Random(seed)
    return {
        "key": key,
        "id": seed,
        "vec": [rnd.random() for _ in range(8)],
        "bin": [bytes([seed % 256, 7])],
        "sparse": {3: 0.5, 1: 0.25},
        "f": float(np.float32(0.1)),
        "d": 0.1,
        "flag": seed % 2 == 0,
        "doc": {"b": [1, 2], "a": "x"},
        "tags": ["t", "u"],
        "dynamic_extra": {"n": seed},
    }


def test_field_order_does_not_matter():
    original = row('k"1', 3)
    reversed_fields = dict(reversed(list(original.items())))
    shuffled = dict(random.Random(1).sample(list(original.items()), len(original)))
    assert row_hash(original, KINDS) == row_hash(reversed_fields, KINDS)
    assert row_hash(original, KINDS) == row_hash(shuffled, KINDS)


def test_json_key_order_and_sparse_order_do_not_matter():
    one = dict(row("k"), doc={"a": "x", "b": [1, 2]}, sparse={1: 0.25, 3: 0.5})
    other = dict(row("k"), doc={"b": [1, 2], "a": "x"}, sparse={3: 0.5, 1: 0.25})
    assert row_hash(one, KINDS) == row_hash(other, KINDS)


def test_awkward_keys_hash_apart_and_stably():
    hashes = {key: row_hash(row(key), KINDS) for key in AWKWARD_KEYS}
    assert len(set(hashes.values())) == len(AWKWARD_KEYS)
    for key in AWKWARD_KEYS:
        assert row_hash(row(key), KINDS) == hashes[key]
    # the key is part of the encoding as UTF-8, unescaped
    assert "ünïcødé-键-🙂".encode() in encode_row(row("ünïcødé-键-🙂"), KINDS)
    assert b'a"b' in encode_row(row('a"b'), KINDS)


def test_float_vectors_compare_as_float32_as_stored():
    values = [0.1, 0.2, 1 / 3]
    as_python = dict(row("k"), vec=values)
    as_float32 = dict(row("k"), vec=list(np.asarray(values, dtype=np.float32)))
    assert row_hash(as_python, KINDS) == row_hash(as_float32, KINDS)
    one_ulp = np.asarray(values, dtype=np.float32)
    one_ulp[1] = np.nextafter(one_ulp[1], np.float32(1))
    assert row_hash(dict(row("k"), vec=list(one_ulp)), KINDS) != row_hash(as_python, KINDS)


@given(st.sampled_from(sorted(set(KINDS) - {"key"})))
def test_any_field_change_changes_the_hash(field):
    base = row("k", 4)
    changed = dict(base)
    changed[field] = row("k", 5)[field] if field != "sparse" else {3: 0.5, 1: 0.75}
    if field in ("f", "d"):
        changed[field] = 0.2
    if field == "doc":
        changed[field] = {"a": "y", "b": [1, 2]}
    if field == "tags":
        changed[field] = ["t"]
    assert row_hash(changed, KINDS) != row_hash(base, KINDS)


def test_field_boundaries_and_missing_values_are_unambiguous():
    kinds = {"a": "VARCHAR", "ab": "VARCHAR", "c": "VARCHAR"}
    assert row_hash({"a": "bc"}, kinds) != row_hash({"ab": "c"}, kinds)
    assert row_hash({"a": "x", "c": ""}, kinds) != row_hash({"a": "x", "c": None}, kinds)
    assert row_hash({"a": "x"}, kinds) != row_hash({"a": "x", "c": ""}, kinds)
    # a dynamic field: 1 and 1.0 are stored differently
    assert row_hash({"n": 1}, {}) != row_hash({"n": 1.0}, {})


@given(st.lists(st.text(), unique=True, max_size=40), st.randoms())
def test_digest_does_not_depend_on_row_order(keys, rnd):
    rows = [row(key, i) for i, key in enumerate(keys)]
    shuffled = list(rows)
    rnd.shuffle(shuffled)
    assert digest_rows(rows, KINDS) == digest_rows(shuffled, KINDS)
    assert digest_rows(rows, KINDS).count == len(keys)


def test_digest_sees_a_missing_a_changed_and_a_doubled_row():
    rows = [row(key, i) for i, key in enumerate(AWKWARD_KEYS)]
    whole = digest_rows(rows, KINDS)
    assert digest_rows(rows[1:], KINDS) != whole
    assert digest_rows([*rows, rows[0]], KINDS) != whole
    changed = [dict(rows[0], d=0.3), *rows[1:]]
    assert digest_rows(changed, KINDS).count == whole.count
    assert digest_rows(changed, KINDS) != whole


def test_digests_add_modulo_2_to_the_128():
    high = Digest(1, MOD - 1)
    assert high.add(2) == Digest(2, 1)
    assert high + Digest(3, 5) == Digest(4, 4)
    assert digest_hashes([MOD - 1, 2]) == Digest(2, 1)
    split = digest_rows([row("a", 1)], KINDS) + digest_rows([row("b", 2)], KINDS)
    assert split == digest_rows([row("b", 2), row("a", 1)], KINDS)
    assert len(split.hex().split(":")[1]) == 32
