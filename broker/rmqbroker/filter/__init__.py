"""Message filters evaluated by the broker: RocketMQ's SQL92 property selectors."""
