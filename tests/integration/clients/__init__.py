"""Stand-alone scripts that drive the stock C++ client (PyPI ``rocketmq``) in a subprocess.

The C++ client's native threads can hang an interpreter at exit, so tests never import it:
each script takes command-line arguments and prints JSON to stdout.
"""
