"""A BrokerGroup as local processes (``rmq-local``): the manifest, the supervised processes, the table."""
