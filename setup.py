"""Compiles the broker's per-message hot path with mypyc; everything else is in pyproject.toml.

The modules below are ordinary, mypy-strict Python: mypyc turns them into C extensions (about
1.4x less broker CPU per message, see bench/RESULTS.md) and the same sources run unchanged as
pure Python when ``RMQ_PURE_PYTHON=1`` is set at install time (no C compiler needed then).
"""

from __future__ import annotations

import os

from setuptools import setup

# Everything a send touches once per message, from the socket read to the response write, and
# the slave's replication receive path. Order does not matter; the group shares one library.
COMPILED = [
    "broker/rmqbroker/remoting/frame.py",
    "broker/rmqbroker/remoting/server.py",
    "broker/rmqbroker/remoting/wire.py",
    "broker/rmqbroker/remoting/latency.py",
    "broker/rmqbroker/ha/transfer.py",
    "broker/rmqbroker/processors/send.py",
    "broker/rmqbroker/store/record.py",
    "broker/rmqbroker/store/commitlog.py",
    "broker/rmqbroker/store/consume_queue.py",
    "broker/rmqbroker/store/index.py",
    "broker/rmqbroker/store/mapped_file.py",
    "broker/rmqbroker/store/message_store.py",
]


def _ext_modules() -> list[object]:
    if os.environ.get("RMQ_PURE_PYTHON", "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    # Type errors are `make test`'s business (mypy --strict over the whole tree); here imports
    # outside the compiled set are followed only for their types.
    return list(mypycify(["--follow-imports=silent", *COMPILED], opt_level="3",
                         group_name="rmqbroker._native"))


setup(ext_modules=_ext_modules())
