"""Admin HTTP endpoint: health, readiness, metrics, status."""
