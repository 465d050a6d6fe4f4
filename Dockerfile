# One image for every role of rmq-brokergroup:
#   rmq-broker    broker (default command)      rmq-namesrv   nameserver
#   rmq-operator  Kubernetes operator (kopf)    rmq-verify    replica verification job (PySpark, Java 17)
#   rmq-admin     mqadmin-style topic and consumer-group administration
# e.g. `podman run IMAGE rmq-namesrv --listen 0.0.0.0:9876`; in Kubernetes set `command:` to one of them.
#
# Python packages are NOT fetched during the build: `make wheels` builds the project and every dependency
# (plus PySpark) into build/image/wheels on the host, and the build installs only those (--no-index).
# `make image` does both; see README ("Container image").
FROM python:3.11-slim-bookworm

LABEL org.opencontainers.image.title="rmq-brokergroup" \
      org.opencontainers.image.description="RocketMQ-compatible broker, nameserver, Kubernetes operator and verification job" \
      org.opencontainers.image.licenses="Apache-2.0"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/rmq \
    PATH=/opt/rmq/bin:$PATH \
    PYSPARK_PYTHON=/opt/rmq/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/rmq/bin/python \
    HOME=/home/rmq

# Java runtime for PySpark (rmq-verify) and tini as PID 1 (forwards SIGTERM, reaps zombies).
# /usr/share/man/man1 must exist for the JRE's postinst on slim images.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*

# Non-root runtime user (uid/gid 10001, matching the chart's securityContext); /data for broker stores.
RUN groupadd --gid 10001 rmq \
 && useradd --uid 10001 --gid 10001 --home-dir /home/rmq --create-home --shell /usr/sbin/nologin rmq \
 && install -d -o 10001 -g 10001 -m 0750 /data

# Install the host-built wheels from a bind mount, so they never become an image layer. The mount is
# not part of the layer cache key: WHEELS_SHA (the wheels' digest, set by `make image`) is.
ARG WHEELS_SHA=unset
RUN --mount=type=bind,source=build/image/wheels,target=/tmp/wheels \
    echo "wheels ${WHEELS_SHA}" \
 && python3 -m venv /opt/rmq \
 && /opt/rmq/bin/pip install --no-cache-dir --no-index --find-links=/tmp/wheels /tmp/wheels/*.whl \
 && /opt/rmq/bin/pip check \
 && command -v rmq-broker rmq-namesrv rmq-admin

USER 10001:10001
WORKDIR /home/rmq

# nameserver, broker remoting, broker HA
EXPOSE 9876 10909 10911 10912

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["rmq-broker"]
