# halfmq broker image: docker build -t halfmq . && docker run -p 9876:9876 -p 10911:10911 -p 5557:5557 halfmq
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HALFMQ_storePathRootDir=/var/lib/halfmq
WORKDIR /opt/halfmq
COPY pyproject.toml README.md ./
COPY broker broker
COPY protocol protocol
COPY store store
COPY client client
COPY conf conf
# The same install the set-up scripts run, into the image's interpreter.
RUN python -m pip install --no-cache-dir . \
    && useradd --system --home-dir /var/lib/halfmq --create-home halfmq \
    && mkdir -p /etc/halfmq && cp conf/broker.conf /etc/halfmq/broker.conf && chown -R halfmq /etc/halfmq

USER halfmq
VOLUME ["/var/lib/halfmq", "/etc/halfmq"]
EXPOSE 9876 10911 5557
# Healthy when the broker answers on its port (a TCP connect is enough: it only listens once ready).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD python -c "import socket; socket.create_connection(('127.0.0.1', 10911), 2).close()"
ENTRYPOINT ["halfmq", "broker", "-c", "/etc/halfmq/broker.conf"]
