"""Bounded inflation and the zlib header check of compressed bodies."""

from __future__ import annotations

import gzip
import zlib

import pytest

from rmqbroker.inflate import InflateError, inflate, looks_like_zlib


def test_inflate_returns_a_whole_stream_within_the_limit() -> None:
    data = bytes(range(256)) * 40
    assert inflate(zlib.compress(data), len(data)) == data


@pytest.mark.parametrize(("data", "reason"), [
    (zlib.compress(bytes(10_001)), "inflates to more than 10000 bytes"),
    (zlib.compress(b"x" * 5000)[:-5], "cut short"),
    (b"not zlib at all", "not a zlib stream"),
])
def test_inflate_refuses_what_does_not_inflate_whole_within_the_limit(data: bytes, reason: str) -> None:
    with pytest.raises(InflateError, match=reason):
        inflate(data, 10_000)


def test_every_zlib_level_and_window_passes_the_header_check() -> None:
    for level in range(10):
        for wbits in range(9, 16):
            c = zlib.compressobj(level, zlib.DEFLATED, wbits)
            assert looks_like_zlib(c.compress(b"body" * 100) + c.flush()), (level, wbits)


@pytest.mark.parametrize("data", [b"", b"x\x9c", b"not-zlib", gzip.compress(b"body"), zlib.compress(b"")[:7],
                                  b"x\x9c"[:1] + b"\x9d" + bytes(10), zlib.compress(b"x", wbits=-15) + bytes(8)])
def test_what_is_not_a_zlib_stream_fails_the_header_check(data: bytes) -> None:
    assert not looks_like_zlib(data)
