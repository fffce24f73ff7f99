# The one-shot service that makes NATS's TLS certificates on first start (compose.yaml,
# service nats-certs): openssl and make-certs.sh, nothing else.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY make-certs.sh /usr/local/bin/make-certs
RUN chmod 0755 /usr/local/bin/make-certs
ENTRYPOINT ["make-certs"]
