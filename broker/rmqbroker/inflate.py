"""Bounded zlib inflation of bodies a peer sends compressed: message and batch bodies, a broker's
registration. A small deflate stream can expand a thousandfold, so a body is inflated only up to
the size its receiver accepts, and one that does not end within that size is refused.
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
