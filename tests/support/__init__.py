"""Test support: real nameserver and broker processes on loopback."""
