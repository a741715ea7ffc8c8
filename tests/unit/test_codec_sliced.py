"""A large message decoded a slice at a time (`base.codec.decode_request_sliced`, used off the event
loop) is the very request `decode_request` gives, whatever the body holds."""

from __future__ import annotations

import datetime
import struct
from typing import Any

import bson
import pytest
from bson.int64 import Int64
from hypothesis import given, settings
from hypothesis import strategies as st

from base import codec
from base.codec import (
    FLAG_CHECKSUM_PRESENT,
    HEADER,
    OP_MSG,
    MalformedRequest,
    decode_request,
    decode_request_sliced,
)


def _frame(body: bytes, flags: int = 0, tail: bytes = b"") -> bytes:
    payload = struct.pack("<I", flags) + b"\x00" + body + tail
    return HEADER.pack(HEADER.size + len(payload), 7, 0, OP_MSG) + payload


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**31, 2**31 - 1), st.text(max_size=6),
                     st.binary(max_size=6), st.floats(allow_nan=False),
                     st.integers(0, 2**62).map(Int64),
                     st.datetimes(min_value=datetime.datetime(1971, 1, 1)).map(lambda d: d.replace(microsecond=0)))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(min_size=1, max_size=4).filter(lambda k: "\x00" not in k), inner, max_size=3), max_leaves=10)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.dictionaries(st.sampled_from(["a", "b", "n"]), _VALUES, max_size=3), max_size=40),
       others=st.dictionaries(st.sampled_from(["x", "y", "$db"]), _VALUES, max_size=3))
def test_the_sliced_decode_is_the_plain_one(rows: list[dict[str, Any]], others: dict[str, Any]) -> None:
    frame = _frame(bson.encode({"insertBlock": "t", "rows": rows, **others, "tags": [1, "two", [3]]}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codec, "SLICE_BYTES", 64)   # every array of more than a few rows is sliced
        sliced = decode_request_sliced(frame)
    assert sliced == decode_request(frame)


def test_a_real_insert_body_is_sliced_and_comes_back_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"day": datetime.datetime(2024, 1, 1), "user": f"u{i % 3}", "n": i} for i in range(30_000)]
    frame = _frame(bson.encode({"insertBlock": "events", "rows": rows, "$db": "app"}))
    plain = decode_request(frame)
    slices: list[int] = []
    decode_one = codec._decode_bson
    monkeypatch.setattr(codec, "_decode_bson", lambda data: slices.append(len(data)) or decode_one(data))
    monkeypatch.setattr(codec, "decode_request", lambda frame: pytest.fail("fell back to the plain decode"))
    request = decode_request_sliced(frame)
    assert request == plain and request.body["rows"][-1]["n"] == 29_999
    assert len(slices) > 2 and max(slices) < codec.SLICE_BYTES + 100, slices   # (a slice ends past the limit)


@pytest.mark.parametrize("frame", [
    _frame(b"\x05\x00\x00"),                                          # truncated body
    _frame(bson.encode({"a": [1, 2]})[:-1] + b"\x01"),                # no terminator
    _frame(bson.encode({"a": 1}), flags=FLAG_CHECKSUM_PRESENT),       # a checksum flag without one
    _frame(bson.encode({"a": 1}), tail=b"\x01\x05\x00\x00\x00x\x00"),  # a sequence after the body
])
def test_what_slicing_does_not_walk_is_decoded_the_usual_way(frame: bytes) -> None:
    sliced, plain = decode_request_sliced(frame), decode_request(frame)
    assert type(sliced) is type(plain)
    if isinstance(plain, MalformedRequest):
        assert (sliced.code, sliced.reason) == (plain.code, plain.reason)


def _array_of(elements: list[tuple[bytes, dict[str, Any]]]) -> bytes:
    body = b"".join(b"\x03" + key + b"\x00" + bson.encode(doc) for key, doc in elements)
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


@pytest.mark.parametrize("keys", [[b"0", b"0", b"0", b"0"], [b"a", b"b", b"a", b"c"]])
def test_an_array_whose_keys_repeat_keeps_every_element(monkeypatch: pytest.MonkeyPatch, keys: list[bytes]) -> None:
    monkeypatch.setattr(codec, "SLICE_BYTES", 8)
    array = _array_of([(k, {"n": i}) for i, k in enumerate(keys)])
    body = b"\x02insertBlock\x00" + struct.pack("<i", 2) + b"t\x00" + b"\x04rows\x00" + array
    frame = _frame(struct.pack("<i", len(body) + 5) + body + b"\x00")
    sliced = decode_request_sliced(frame)
    assert sliced == decode_request(frame) and [r["n"] for r in sliced.body["rows"]] == [0, 1, 2, 3]


def test_an_array_that_ends_early_is_invalid_bson_as_the_plain_decoder_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "SLICE_BYTES", 8)
    array = bytearray(_array_of([(b"0", {"n": 0}), (b"1", {"n": 1})]))
    array[4 + len(b"\x030\x00") + len(bson.encode({"n": 0}))] = 0   # a terminator after the first element
    body = b"\x04rows\x00" + bytes(array) + b"\x10n\x00" + struct.pack("<i", 1)
    frame = _frame(struct.pack("<i", len(body) + 5) + body + b"\x00")
    plain, sliced = decode_request(frame), decode_request_sliced(frame)
    assert isinstance(plain, MalformedRequest) and isinstance(sliced, MalformedRequest)
    assert (sliced.code, sliced.reason) == (plain.code, plain.reason)
