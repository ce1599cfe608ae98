# halfmq broker image: docker build -t halfmq . && docker run -p 9876:9876 -p 10911:10911 -p 5557:5557 halfmq
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/halfmq/.venv/bin:$PATH \
    HALFMQ_storePathRootDir=/var/lib/halfmq \
    HALFMQ_aclConfigFile=/etc/halfmq/plain_acl.yml
WORKDIR /opt/halfmq
COPY pyproject.toml README.md ./
COPY broker broker
COPY protocol protocol
COPY store store
COPY client client
COPY pipeline pipeline
COPY conf conf
COPY scripts scripts
# The same install step the README's commands and the tests run (.venv with halfmq in it).
RUN bash scripts/bootstrap.sh \
    && useradd --system --home-dir /var/lib/halfmq --create-home halfmq \
    && mkdir -p /etc/halfmq && cp conf/broker.conf conf/plain_acl.yml /etc/halfmq/ && chown -R halfmq /etc/halfmq

USER halfmq
VOLUME ["/var/lib/halfmq", "/etc/halfmq"]
EXPOSE 9876 10911 5557
# Healthy when the broker answers on its port (it listens only once the store is open and services run).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD python -c "import socket; socket.create_connection(('127.0.0.1', 10911), 2).close()"
ENTRYPOINT ["halfmq", "broker", "-c", "/etc/halfmq/broker.conf"]
