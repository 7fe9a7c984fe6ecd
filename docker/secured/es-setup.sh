#!/usr/bin/env bash
# Certificates for the secured single-node Elasticsearch (docker/elasticsearch-secured.yml), as in Elastic's
# documented docker-compose: a CA and a node certificate (es01, localhost, 127.0.0.1) made with
# elasticsearch-certutil, in PEM, on the `certs` volume. Runs once as root in the Elasticsearch image; a second
# run keeps the existing CA and certificates.
set -euo pipefail
cd /usr/share/elasticsearch
certs=config/certs
if [ ! -f "$certs/ca.zip" ]; then
  echo "esqbe setup: creating the CA"
  bin/elasticsearch-certutil ca --silent --pem -out "$certs/ca.zip"
  unzip -q -o "$certs/ca.zip" -d "$certs"
fi
if [ ! -f "$certs/certs.zip" ]; then
  echo "esqbe setup: creating the node certificate"
  printf 'instances:\n  - name: es01\n    dns: [es01, localhost]\n    ip: [127.0.0.1]\n' > "$certs/instances.yml"
  bin/elasticsearch-certutil cert --silent --pem -out "$certs/certs.zip" --in "$certs/instances.yml" \
    --ca-cert "$certs/ca/ca.crt" --ca-key "$certs/ca/ca.key"
  unzip -q -o "$certs/certs.zip" -d "$certs"
fi
mkdir -p "$certs/esqbe"
chown -R root:root "$certs"
find "$certs" -type d -exec chmod 750 {} \;
find "$certs" -type f -exec chmod 640 {} \;
# the CA certificate is public: readable by anyone, copied out with `docker compose cp` (docker/README.md)
chmod 755 "$certs" "$certs/ca" "$certs/esqbe"
chmod 644 "$certs/ca/ca.crt"
echo "esqbe setup: certificates ready"
