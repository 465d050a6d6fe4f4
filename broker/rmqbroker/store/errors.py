"""Typed errors raised by the store package."""

from __future__ import annotations


class StoreError(Exception):
    """Base class for every error raised by :mod:`rmqbroker.store`."""


class StoreFullError(StoreError):
    """No room on the disk for a store file's next bytes (ENOSPC or a quota); nothing was written.

    Raised before a write, when blocks are reserved for it, so that a full disk is an error on
    that write rather than a SIGBUS on a write through the mapping.
    """


class StoreConfigError(StoreError, ValueError):
    """The on-disk store does not match the configuration (e.g. a segment of the wrong size)."""


class CorruptRecordError(StoreError, ValueError):
    """Bytes that should hold a record (stored message, batch entry, CQ unit) do not.

    ``position`` is the offset of the offending record inside the buffer that was parsed (or the
    physical offset, when the caller knows it), so recovery can log where the stop point is.
    """

    def __init__(self, message: str, position: int = -1) -> None:
        super().__init__(message)
        self.position = position


class MessageIdError(StoreError, ValueError):
    """A string is not an offset message id (§3.5)."""


class StoreLockedError(StoreError):
    """Another process holds the store's ``lock`` file."""
