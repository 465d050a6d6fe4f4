"""Broker-wide counters read by the admin endpoint's Prometheus collector."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BrokerStats:
    """Plain counters: cheap to bump on the hot path, exported as Prometheus counters."""

    msgs_in: int = 0
    bytes_in: int = 0
    msgs_out: int = 0
    bytes_out: int = 0
    send_rejected: dict[int, int] = field(default_factory=dict)  # by response code
    pull_held: int = 0

    def rejected(self, code: int) -> None:
        self.send_rejected[code] = self.send_rejected.get(code, 0) + 1
