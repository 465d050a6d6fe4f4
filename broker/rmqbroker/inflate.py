"""zlib bodies a peer sends compressed: bounded inflation of batch bodies and a broker's
registration (a small deflate stream can expand a thousandfold, so a body is inflated only up to
the size its receiver accepts, and one that does not end within that size is refused), and the
cheap header check of a compressed message body the broker stores without inflating it.
"""

from __future__ import annotations

try:
    # ISA-L inflates the same streams about twice as fast as zlib.
    import isal.isal_zlib as _zlib
except ImportError:  # no isal wheel for this platform
    import zlib as _zlib  # type: ignore[no-redef]

# isal's stub does not declare its error an exception class.
_ZLIB_ERROR: type[Exception] = getattr(_zlib, "error")  # noqa: B009


class InflateError(ValueError):
    """The data is not one whole zlib stream, or inflates to more than allowed."""


def inflate(data: bytes, limit: int) -> bytes:
    """``data`` inflated, refused (InflateError) past ``limit`` bytes of output or when the stream
    is corrupt or cut short."""
    d = _zlib.decompressobj()
    try:
        out: bytes = d.decompress(data, limit + 1)
    except _ZLIB_ERROR as exc:
        raise InflateError(f"not a zlib stream: {exc}") from exc
    if len(out) > limit:
        raise InflateError(f"inflates to more than {limit} bytes")
    if not d.eof:
        raise InflateError("the zlib stream is cut short")
    return out


def looks_like_zlib(data: bytes) -> bool:
    """Whether ``data`` starts as a zlib stream (RFC 1950): deflate with a window of at most 32 KiB,
    a valid header check, no preset dictionary, and room for the smallest whole stream (8 bytes)."""
    if len(data) < 8:
        return False
    cmf, flg = data[0], data[1]
    return cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf << 8 | flg) % 31 == 0 and not flg & 0x20
