#!/usr/bin/env bash
# Make a private CA and certificates for a TLS Dask cluster, with openssl:
#   ca.pem            the CA every process trusts (give it to the scheduler, workers and clients)
#   node.pem/.key     the scheduler's and workers' certificate
#   client.pem/.key   the client's certificate (dl1 fit --scheduler tls://..., Python clients)
# Usage: bash cluster/make-certs.sh DIR [DAYS]   (default 365 days). Keys are written 0600;
# keep ca.key offline or delete it once the certificates are made.
set -euo pipefail
dir="${1:?usage: make-certs.sh DIR [DAYS]}"
days="${2:-365}"
mkdir -p "$dir"
umask 077
cd "$dir"
openssl req -x509 -newkey rsa:3072 -nodes -keyout ca.key -out ca.pem -days "$days" \
    -subj "/CN=dl1 cluster CA" 2>/dev/null
for who in node client; do
    openssl req -newkey rsa:3072 -nodes -keyout "$who.key" -out "$who.csr" \
        -subj "/CN=dl1 $who" 2>/dev/null
    openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
        -out "$who.pem" -days "$days" 2>/dev/null
    rm -f "$who.csr"
done
echo "certificates in $dir: ca.pem, node.pem/node.key, client.pem/client.key"
