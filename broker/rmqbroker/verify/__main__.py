"""``python -m rmqbroker.verify`` and the file spark-submit runs (``.../rmqbroker/verify/__main__.py``)."""

import sys

from rmqbroker.verify.cli import main

if __name__ == "__main__":
    sys.exit(main())
