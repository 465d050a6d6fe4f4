"""Typed errors raised by the metadata package."""

from __future__ import annotations


class MetadataError(Exception):
    """Base class for every error raised by :mod:`rmqbroker.metadata`."""


class MetadataFormatError(MetadataError, ValueError):
    """Text is not (fastjson-flavoured) JSON, or its shape is not what the file should hold."""


class MetadataLoadError(MetadataError):
    """A metadata file is corrupt and no usable ``.bak`` exists.

    Raised instead of starting empty so that a later persist cannot overwrite the only copy of
    offsets/topics that an operator might still recover by hand.
    """


class MetadataPersistError(MetadataError):
    """Writing a metadata file (tmp write, fsync, backup or rename) failed."""
