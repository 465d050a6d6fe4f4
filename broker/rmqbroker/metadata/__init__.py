"""Metadata: topics, subscription groups, consumer/delay offsets, DataVersion, atomic JSON files.

Each manager owns one file under ``<storePathRootDir>/config/`` with RocketMQ's name and JSON
shape, loads Java-written (fastjson) content, and writes crash-safely with a ``.bak`` copy.
Blocking writes are exposed as ``persist()`` and as ``persist_async()`` for the event loop.
"""

from rmqbroker.metadata.consumer_offsets import ConsumerOffsetManager
from rmqbroker.metadata.data_version import DataVersion
from rmqbroker.metadata.delay_offsets import DelayOffsetTable
from rmqbroker.metadata.errors import (
    MetadataError,
    MetadataFormatError,
    MetadataLoadError,
    MetadataPersistError,
)
from rmqbroker.metadata.jsonfile import atomic_write, fastjson_loads, load_with_backup
from rmqbroker.metadata.subscription_groups import SubscriptionGroupConfig, SubscriptionGroupManager
from rmqbroker.metadata.topics import TopicConfig, TopicConfigManager, validate_topic

__all__ = [
    "ConsumerOffsetManager",
    "DataVersion",
    "DelayOffsetTable",
    "MetadataError",
    "MetadataFormatError",
    "MetadataLoadError",
    "MetadataPersistError",
    "SubscriptionGroupConfig",
    "SubscriptionGroupManager",
    "TopicConfig",
    "TopicConfigManager",
    "atomic_write",
    "fastjson_loads",
    "load_with_backup",
    "validate_topic",
]
