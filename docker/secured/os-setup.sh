#!/usr/bin/env bash
# TLS and the admin password for the secured single-node OpenSearch (docker/opensearch-secured.yml).
# Runs once as root in the OpenSearch image, with only what the image ships (the bundled JDK's keytool and the
# security plugin's hash tool), writing to the `certs` and `security` volumes:
#   - a CA (CN=esqbe-test-ca) and a node certificate for os01 / localhost / 127.0.0.1 signed by it, in PKCS#12
#     keystores; ca.crt in PEM for clients (--ca-certs);
#   - the security configuration shipped with the image, with internal_users.yml replaced by one user, `admin`,
#     whose password is ESQBE_OS_PASSWORD (bcrypt hash).
# A second run keeps the existing CA, certificates and users.
set -euo pipefail
home=/usr/share/opensearch
kt="$home/jdk/bin/keytool"
certs=/certs
pass=esqbe-keystore   # protects the keystores on the volume; not a login secret
cd "$certs"
if [ ! -f ca.p12 ]; then
  echo "esqbe setup: creating the CA and the node certificate"
  "$kt" -genkeypair -alias ca -keyalg RSA -keysize 2048 -validity 3650 -dname "CN=esqbe-test-ca" \
    -ext bc:c -keystore ca.p12 -storetype PKCS12 -storepass "$pass"
  "$kt" -exportcert -rfc -alias ca -keystore ca.p12 -storepass "$pass" -file ca.crt
  "$kt" -genkeypair -alias node -keyalg RSA -keysize 2048 -validity 3650 -dname "CN=os01" \
    -keystore node.p12 -storetype PKCS12 -storepass "$pass"
  "$kt" -certreq -alias node -keystore node.p12 -storepass "$pass" -file node.csr
  "$kt" -gencert -alias ca -keystore ca.p12 -storepass "$pass" -infile node.csr -outfile node.crt -rfc -validity 3650 \
    -ext "SAN=dns:os01,dns:localhost,ip:127.0.0.1" -ext "KU=digitalSignature,keyEncipherment" -ext "EKU=serverAuth,clientAuth"
  "$kt" -importcert -noprompt -alias ca -keystore node.p12 -storepass "$pass" -file ca.crt
  "$kt" -importcert -noprompt -alias node -keystore node.p12 -storepass "$pass" -file node.crt
  "$kt" -importcert -noprompt -alias ca -keystore truststore.p12 -storetype PKCS12 -storepass "$pass" -file ca.crt
fi
if [ ! -f /security/internal_users.yml ] || ! grep -q "esqbe" /security/internal_users.yml; then
  : "${ESQBE_OS_PASSWORD:?set ESQBE_OS_PASSWORD (the admin password)}"
  echo "esqbe setup: security configuration with the admin user"
  cp -r "$home/config/opensearch-security/." /security/
  hash=$(OPENSEARCH_JAVA_HOME="$home/jdk" bash "$home/plugins/opensearch-security/tools/hash.sh" -p "$ESQBE_OS_PASSWORD" | tail -n 1)
  cat > /security/internal_users.yml <<USERS
_meta:
  type: "internalusers"
  config_version: 2
admin:
  hash: "$hash"
  reserved: true
  backend_roles: ["admin"]
  description: "esqbe admin (docker/opensearch-secured.yml)"
USERS
fi
chown -R 1000:1000 "$certs" /security
chmod 644 "$certs/ca.crt"
echo "esqbe setup: ready"
