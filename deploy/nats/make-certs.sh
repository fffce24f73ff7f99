#!/bin/sh
# NATS's TLS certificates, made once: a CA, and a server certificate for the names the
# clients use (nats on the compose network; localhost and 127.0.0.1 from the host).
#
#   /tls  (volume nats-tls, mounted by NATS only)   server-key.pem (0400), server-cert.pem
#   /ca   (volume nats-ca, mounted by every client)  ca.pem
#
# Existing certificates are kept. The CA's key is thrown away once the server
# certificate is signed, so nothing else can ever be issued under it; to renew, delete
# both volumes (docker compose down, docker volume rm <project>_nats-tls <project>_nats-ca).
set -eu
TLS=${TLS_DIR:-/tls}
CA=${CA_DIR:-/ca}
NAMES=${CERT_NAMES:-DNS:nats,DNS:localhost,IP:127.0.0.1}

if [ -s "$TLS/server-cert.pem" ] && [ -s "$TLS/server-key.pem" ] && [ -s "$CA/ca.pem" ]; then
  echo "nats-certs: certificates present, kept"
  exit 0
fi

umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
  -subj "/CN=Trove NATS CA" -keyout "$work/ca-key.pem" -out "$work/ca.pem" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=nats" \
  -keyout "$work/server-key.pem" -out "$work/server.csr" 2>/dev/null
cat >"$work/server.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$NAMES
EXT
openssl x509 -req -in "$work/server.csr" -CA "$work/ca.pem" -CAkey "$work/ca-key.pem" \
  -CAcreateserial -days 825 -extfile "$work/server.ext" -out "$work/server-cert.pem" 2>/dev/null

# The CA goes last: its presence says the set is complete.
install -m 0400 "$work/server-key.pem" "$TLS/server-key.pem"
install -m 0444 "$work/server-cert.pem" "$TLS/server-cert.pem"
install -m 0444 "$work/ca.pem" "$CA/ca.pem"
echo "nats-certs: made a CA and a server certificate for $NAMES"
