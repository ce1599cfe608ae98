# halfmq broker image (remoting, name server, metrics, and gRPC for RocketMQ 5 clients): docker build -t halfmq .
# (docs/operations.md's Docker section shows how to run it; tests/test_docker.py runs those commands)
# BASE_IMAGE: any Debian-like image with python3 (>= 3.11, with venv), useradd, and apt sources that have tini,
# etcd-server and etcd-client (Debian 12's have them); tests/test_docker.py builds on one it makes with debootstrap
# (scripts/make_base_image.sh), as no image registry is reachable there.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/halfmq/.venv/bin:$PATH \
    HALFMQ_storePathRootDir=/var/lib/halfmq \
    HALFMQ_aclConfigFile=/etc/halfmq/plain_acl.yml
# tini is PID 1: it hands docker stop's SIGTERM to the broker and reaps. (The broker can be PID 1 too, e.g. under
# `docker run --entrypoint halfmq`: its store writer checks for its own broker's PID, not for a parent other than 1.)
# etcd-server and etcd-client (etcd, etcdctl): docker-compose.yml runs its 3-member etcd, on which broker groups
# elect their leader, from this image. policy-rc.d forbids service starts, as in Debian's own images: etcd-server's
# install would otherwise start a system etcd in the build; a container runs only its command.
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d \
    && apt-get update && apt-get install -y --no-install-recommends tini etcd-server etcd-client \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/halfmq
COPY pyproject.toml README.md ./
COPY broker broker
COPY protocol protocol
COPY store store
COPY transactions transactions
COPY client client
COPY pipeline pipeline
COPY dashboard dashboard
COPY conf conf
COPY scripts scripts
# The same install step the README's commands and the tests run (.venv with halfmq and its gRPC endpoint in it).
RUN bash scripts/bootstrap.sh grpc \
    && useradd --system --home-dir /var/lib/halfmq --create-home halfmq \
    && mkdir -p /etc/halfmq && cp conf/broker.conf conf/plain_acl.yml /etc/halfmq/ && chown -R halfmq /etc/halfmq

USER halfmq
VOLUME ["/var/lib/halfmq", "/etc/halfmq"]
EXPOSE 9876 10911 10912 5557 8081 8080
# Healthy when the broker answers on its port (it listens only once the store is open and services run): the
# listenPort the running broker was given, by broker.conf, HALFMQ_listenPort or a flag (broker/health.py).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-m", "halfmq.broker.health"]
ENTRYPOINT ["tini", "--", "halfmq", "broker", "-c", "/etc/halfmq/broker.conf"]
