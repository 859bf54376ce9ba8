# storage-gateway: the same `storage-gateway serve` the test suite starts, on a slim Python 3.11.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GATEWAY_DATA_DIR=/data \
    GATEWAY_LOG_FORMAT=json

WORKDIR /app

# Pinned dependencies first (a layer that changes only with the lock file), then the package itself.
COPY requirements.lock ./
RUN pip install -r requirements.lock
# README.md* : the glob keeps the build working while the README is absent.
COPY pyproject.toml README.md* alembic.ini ./
COPY app ./app
COPY migrations ./migrations
RUN pip install --no-deps . \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin gateway \
    && mkdir -p /data && chown gateway:gateway /data

USER gateway
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('GATEWAY_PORT', '8000') + '/healthz', timeout=2)"]

# SIGTERM finishes in-flight requests (GATEWAY_SHUTDOWN_GRACE_SECONDS) and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["storage-gateway", "serve", "--host", "0.0.0.0"]
