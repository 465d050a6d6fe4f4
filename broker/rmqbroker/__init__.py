"""RocketMQ-compatible broker and nameserver."""
