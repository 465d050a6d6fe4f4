"""Request handling time per request code, counted in plain lists on the request path.

The remoting server feeds it once per request (it is compiled with the rest of the hot path);
the admin endpoint turns a snapshot into a Prometheus histogram at scrape time.
"""

from __future__ import annotations

# Upper bounds in seconds; one more bucket counts everything above the last bound.
LATENCY_BUCKETS: tuple[float, ...] = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)


class RequestLatency:
    """Per-code bucket counts and sums: a bucket scan and two increments per observation."""

    def __init__(self) -> None:
        self._counts: dict[int, list[int]] = {}
        self._sums: dict[int, float] = {}

    def observe(self, code: int, seconds: float) -> None:
        counts = self._counts.get(code)
        if counts is None:
            counts = self._counts[code] = [0] * (len(LATENCY_BUCKETS) + 1)
            self._sums[code] = 0.0
        # First bound >= seconds (bisect_left), as a compiled loop over native floats.
        i = 0
        for bound in LATENCY_BUCKETS:
            if seconds <= bound:
                break
            i += 1
        counts[i] += 1
        self._sums[code] += seconds

    def snapshot(self) -> dict[int, tuple[list[int], float]]:
        """``{code: (per-bucket counts, sum of seconds)}``, copied."""
        return {code: (list(counts), self._sums[code]) for code, counts in self._counts.items()}
