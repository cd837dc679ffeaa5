#!/bin/sh
# Certificates for the TLS listener's tests and benchmark, made fresh in DIR (ECDSA P-256, valid
# one day): ca.pem and other-ca.pem (two CAs), node.pem/node.key (the server: SANs 127.0.0.1,
# ::1 and localhost, by ca), and client certificates by ca: alice, bob and nobody (CN and a DNS
# SAN NAME.clients.test), plus stranger (CN alice, but issued by other-ca), and revoked (by ca,
# then revoked: crl.pem is ca's revocation list naming it). NAME... after DIR adds client
# certificates of those names.
set -eu
dir=$1
shift
mkdir -p "$dir"
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() {
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -days 1 -subj "/CN=$2" -out "$1.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    2>/dev/null
}
leaf() {  # NAME CA SUBJECT_CN SAN USAGE
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$3" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' "$4" "$5" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 1 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca "rlm-sandbox test CA"
ca other-ca "another CA"
leaf node ca node1 "IP:127.0.0.1,IP:::1,DNS:localhost" serverAuth
for name in alice bob nobody "$@"; do
  leaf "$name" ca "$name" "DNS:$name.clients.test" clientAuth
done
leaf stranger other-ca alice "DNS:alice.clients.test" clientAuth
# ca's revocation list (one day, as the certificates), revoking `revoked`.
leaf revoked ca revoked "DNS:revoked.clients.test" clientAuth
mkdir -p crl-db
: > crl-db/index.txt
echo 1000 > crl-db/crlnumber
printf '[ca]\ndefault_ca = test\n[test]\ndatabase = crl-db/index.txt\ncrlnumber = crl-db/crlnumber\ndefault_md = sha256\ndefault_crl_days = 1\n' \
  > crl-db/ca.cnf
openssl ca -config crl-db/ca.cnf -cert ca.pem -keyfile ca.key -revoke revoked.pem 2>/dev/null
openssl ca -config crl-db/ca.cnf -cert ca.pem -keyfile ca.key -gencrl -out crl.pem 2>/dev/null
