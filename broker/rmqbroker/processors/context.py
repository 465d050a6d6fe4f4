"""What every processor may use: settings, store, metadata managers, client registry, stats."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rmqbroker.config import BrokerSettings
from rmqbroker.metadata.consumer_offsets import ConsumerOffsetManager
from rmqbroker.metadata.delay_offsets import DelayOffsetTable
from rmqbroker.metadata.subscription_groups import SubscriptionGroupManager
from rmqbroker.metadata.topics import TopicConfigManager
from rmqbroker.processors.clients import ClientManager
from rmqbroker.processors.relay import WriteRelay
from rmqbroker.stats import BrokerStats
from rmqbroker.store.message_store import MessageStore


def _noop() -> None:
    return None


async def _anoop() -> None:
    return None


def _unknown() -> str | None:
    return None


def _never(_host: str) -> bool:
    return False


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
    # Re-registers now and returns once the nameservers have the topic table as it is now (or a
    # bounded wait gave up): a request that created a topic is answered once it is routed, as in Java.
    register_and_wait: Callable[[], Awaitable[None]] = _anoop
    # Runtime role: starts from broker.conf, changed by promotion/demotion (POST /role).
    role: str = ""
    broker_id: int = -1
    # A slave forwards clients' writes to its master (relaySendsToMaster); None: refused here.
    relay: WriteRelay | None = None
    # Whether a peer host is one of the slaves this master streams to: the writes they relay name
    # the client's address as the born host (RELAYED_FOR); anyone else's claim is ignored.
    relays_from: Callable[[str], bool] = _never
    # The identity of the log this broker holds (the HA epoch store's logId; None: none yet).
    log_id: Callable[[], str | None] = _unknown

    def __post_init__(self) -> None:
        if not self.role:
            self.role = self.settings.brokerRole
        if self.broker_id < 0:
            self.broker_id = self.settings.brokerId

    @property
    def is_slave(self) -> bool:
        return self.role == "SLAVE"

    @property
    def writable(self) -> bool:
        return bool(self.settings.brokerPermission & 0x2) and not self.is_slave and not self.store.term_fenced
