"""Kubernetes operator for BrokerGroup resources."""
