"""Store: record codec, mapped files, commitlog, consume queues, recovery, flush.

Modules: ``record`` (the one stored-record codec: §3 layouts, properties, msg ids, tagsCode, batch
bodies), ``mapped_file`` (fixed-size mmap'd segments), ``commitlog``, ``consume_queue``,
``checkpoint`` (checkpoint file + abort marker), ``config`` (:class:`StoreConfig`), ``errors`` and
``message_store`` (the :class:`MessageStore` facade the broker uses).
"""
