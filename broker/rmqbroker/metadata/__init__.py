"""Metadata: topics, subscription groups, consumer/delay offsets, DataVersion, atomic JSON files."""
