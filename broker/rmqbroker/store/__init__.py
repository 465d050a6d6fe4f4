"""Store: record codec, mapped files, commitlog, consume queues, recovery, flush."""
