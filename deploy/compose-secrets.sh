#!/bin/sh
# Random passwords for compose.yaml's NATS users, written to .env beside it (Compose
# reads it for ${...} in compose.yaml). A password already in .env is kept, so running
# this again only adds what is missing.
#
#   sh deploy/compose-secrets.sh && docker compose up -d
set -eu
cd "$(dirname "$0")/.."
ENV_FILE=${ENV_FILE:-.env}
touch "$ENV_FILE"
chmod 0600 "$ENV_FILE"
# The project's name, as `name:` would give it in Compose v2 (docker-compose 1.29
# reads no top-level name): volumes are trove_nats-data, trove_postgres-data, ...
grep -q '^COMPOSE_PROJECT_NAME=' "$ENV_FILE" || echo 'COMPOSE_PROJECT_NAME=trove' >>"$ENV_FILE"
for name in NATS_DISCOVERY_PASSWORD NATS_FETCHER_PASSWORD NATS_RECORDER_PASSWORD \
  NATS_OPERATOR_PASSWORD NATS_BOX_PASSWORD; do
  if ! grep -q "^$name=" "$ENV_FILE"; then
    # Hex: safe inside a URL (tls://user:password@nats:4222) without escaping.
    printf '%s=%s\n' "$name" "$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')" >>"$ENV_FILE"
    echo "added $name to $ENV_FILE"
  fi
done
