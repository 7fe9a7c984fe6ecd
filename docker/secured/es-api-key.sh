#!/usr/bin/env bash
# Creates a least-privilege API key for esqbe on the secured Elasticsearch (docker/elasticsearch-secured.yml)
# and writes its encoded form to config/certs/esqbe/api_key (read it with `docker compose cp`).
# Index privileges only, no cluster privilege (so GET / answers 403, which esqbe handles):
#   create_index, view_index_metadata (mapping, settings), read (_mget, _msearch, _search), write (_bulk),
#   maintenance (_refresh) on ESQBE_API_KEY_INDICES (default "esqbe*", comma-separated patterns).
# Runs in the Elasticsearch image (curl) with ELASTIC_PASSWORD set; waits for the node.
set -euo pipefail
cd /usr/share/elasticsearch
ca=config/certs/ca/ca.crt
url=${ESQBE_ES_INTERNAL_URL:-https://es01:9200}
out=config/certs/esqbe/api_key
if [ -s "$out" ]; then
  echo "esqbe api key: already made ($out)"; exit 0
fi
until curl -s --cacert "$ca" "$url" | grep -q "missing authentication credentials"; do
  echo "esqbe api key: waiting for Elasticsearch"; sleep 5
done
names=$(printf '%s' "${ESQBE_API_KEY_INDICES:-esqbe*}" | sed 's/[^,][^,]*/"&"/g')
body='{"name":"esqbe","role_descriptors":{"esqbe":{"cluster":[],"indices":[{"names":['"$names"'],"privileges":["create_index","view_index_metadata","read","write","maintenance"]}]}}}'
resp=$(curl -s --cacert "$ca" -u "elastic:${ELASTIC_PASSWORD}" -H 'Content-Type: application/json' \
  -X POST "$url/_security/api_key" -d "$body")
key=$(printf '%s' "$resp" | grep -o '"encoded":"[^"]*"' | cut -d'"' -f4)
if [ -z "$key" ]; then
  echo "esqbe api key: creation failed: $resp" >&2; exit 1
fi
umask 022
printf '%s\n' "$key" > "$out"
chmod 644 "$out"
echo "esqbe api key: written to $out"
