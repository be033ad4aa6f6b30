#!/bin/sh
# The cluster's own certificate authority and the certificates signed by it
# that docker/compose.yaml mounts from docker/tls/ (docs/operations.md):
#
#   cluster-ca.crt              what every node and Django service trusts for Redis and the node links
#   redis.crt, redis.key        Redis's TLS certificate (DNS:redis)
#   cluster-node.crt/.key       what the brokerd nodes present to each other (mutual TLS on the links)
#
# The CA's key (cluster-ca.key) signs nothing else: keep it off the hosts
# after this runs. Usage: docker/cluster-certs.sh [DIR] (default docker/tls);
# existing files are kept (delete them to issue new ones). Needs openssl.
set -eu
dir=${1:-$(dirname "$0")/tls}
days=${CLUSTER_CERT_DAYS:-825}
mkdir -p "$dir"
cd "$dir"

if [ ! -f cluster-ca.crt ]; then
  openssl req -x509 -newkey rsa:3072 -nodes -days "$days" -subj "/CN=mqtthub cluster CA" \
    -keyout cluster-ca.key -out cluster-ca.crt \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
fi

issue() {   # NAME SUBJECT-ALT-NAMES EXTENDED-USAGE
  [ -f "$1.crt" ] && return 0
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' "$2" "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA cluster-ca.crt -CAkey cluster-ca.key -CAcreateserial -days "$days" \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

issue redis "DNS:redis,DNS:localhost,IP:127.0.0.1" serverAuth
issue cluster-node "DNS:brokerd1,DNS:brokerd2,DNS:brokerd3" "serverAuth,clientAuth"
# read by the containers' own users (mqtthub: uid 10001, redis: uid 999)
chmod 0644 cluster-ca.crt redis.crt redis.key cluster-node.crt cluster-node.key
chmod 0600 cluster-ca.key
echo "cluster certificates in $dir: cluster-ca.crt redis.crt/.key cluster-node.crt/.key"
