"""What every processor may use: settings, store, metadata managers, client registry, stats."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rmqbroker.config import BrokerSettings
from rmqbroker.metadata.consumer_offsets import ConsumerOffsetManager
from rmqbroker.metadata.delay_offsets import DelayOffsetTable
from rmqbroker.metadata.subscription_groups import SubscriptionGroupManager
from rmqbroker.metadata.topics import TopicConfigManager
from rmqbroker.processors.clients import ClientManager
from rmqbroker.stats import BrokerStats
from rmqbroker.store.message_store import MessageStore


def _noop() -> None:
    return None


@dataclass
class BrokerContext:
    settings: BrokerSettings
    store: MessageStore
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager
    delay_offsets: DelayOffsetTable
    clients: ClientManager
    stats: BrokerStats = field(default_factory=BrokerStats)
    # Asks the composition root to re-register with the nameservers now (topic changes).
    register_now: Callable[[], None] = _noop

    @property
    def writable(self) -> bool:
        return bool(self.settings.brokerPermission & 0x2) and not self.settings.is_slave
