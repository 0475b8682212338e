#!/usr/bin/env bash
# secrets.sh OVERLAY_DIR: writes the credential files an overlay's secretGenerators read, into
# OVERLAY_DIR/secrets/ (ignored by Git), so that `kubectl apply -k OVERLAY_DIR` finds them. Only
# the files the overlay's kustomization.yaml names (secrets/<file>) are made, and a file that
# exists is left alone: run it again after adding a component, or delete a file to make it anew.
#
#   redis-password, audit-token, admission-token   32 random bytes, hex (openssl rand -hex 32)
#   ca.crt, tls.crt, tls.key   a CA of its own (ca.key stays here) and the serving certificate it
#                              signs, for the Services kubescribe-{audit,admission,metrics}
#                              in namespace kubescribe, plus $KUBESCRIBE_EXTRA_SANS
#                              (openssl's form: "IP:10.96.0.50,DNS:kubescribe.example.com")
#   admission-client-ca.crt    a second CA (admission-client-ca.key stays here), which signs only
#                              the apiserver's admission client certificate: admission-client.crt
#                              and .key, CN kube-apiserver, for its AdmissionConfiguration
#
# The CAs are valid for 10 years, the certificates for one. Nothing here is sent anywhere; keep
# the folder as you would keep the credentials (docs/install.md).
set -euo pipefail

if [ $# -ne 1 ] || [ ! -f "$1/kustomization.yaml" ]; then
	echo "usage: $0 OVERLAY_DIR (a folder with a kustomization.yaml, e.g. deploy/overlays/quickstart)" >&2
	exit 2
fi
overlay=$1
dir=$overlay/secrets
namespace=kubescribe
umask 077
mkdir -p "$dir"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A minimal openssl configuration, so that nothing of the system's applies.
cat >"$tmp/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF

# new_ca NAME CN: NAME.crt and NAME.key, a self-signed CA.
new_ca() {
	openssl req -x509 -new -config "$tmp/openssl.cnf" -extensions ca -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
		-nodes -days 3650 -subj "/CN=$2" -keyout "$dir/$1.key" -out "$dir/$1.crt" 2>/dev/null
}

# new_cert NAME CA CN EXTENSIONS: NAME.crt and NAME.key, signed by CA.crt/CA.key.
new_cert() {
	printf '%s\n' "$4" >"$tmp/ext"
	openssl req -new -config "$tmp/openssl.cnf" -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-subj "/CN=$3" -keyout "$dir/$1.key" -out "$tmp/$1.csr" 2>/dev/null
	openssl x509 -req -in "$tmp/$1.csr" -CA "$dir/$2.crt" -CAkey "$dir/$2.key" -set_serial "0x$(openssl rand -hex 16)" \
		-days 365 -extfile "$tmp/ext" -out "$dir/$1.crt" 2>/dev/null
}

serving() {
	[ -f "$dir/ca.crt" ] && [ -f "$dir/ca.key" ] || new_ca ca kubescribe-serving-ca
	local sans="" svc
	for svc in kubescribe-audit kubescribe-admission kubescribe-metrics; do
		sans="$sans,DNS:$svc.$namespace.svc,DNS:$svc.$namespace.svc.cluster.local"
	done
	sans=${sans#,}${KUBESCRIBE_EXTRA_SANS:+,$KUBESCRIBE_EXTRA_SANS}
	new_cert tls ca kubescribe-audit."$namespace".svc "basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = $sans"
	echo "wrote $dir/tls.crt for $sans"
}

admission_client() {
	new_ca admission-client-ca kubescribe-admission-client-ca
	new_cert admission-client admission-client-ca kube-apiserver "basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth"
	echo "wrote $dir/admission-client.crt and .key for the apiserver's AdmissionConfiguration"
}

# The secrets/<file> names the kustomization reads, in order, once each.
wanted=$( (grep -o 'secrets/[A-Za-z0-9._-]*' "$overlay/kustomization.yaml" || true) | sed 's|^secrets/||' | awk '!seen[$0]++')
if [ -z "$wanted" ]; then
	echo "$overlay/kustomization.yaml reads no secrets/ file: nothing to do" >&2
	exit 0
fi
for f in $wanted; do
	if [ -f "$dir/$f" ]; then
		continue
	fi
	case $f in
	redis-password | audit-token | admission-token)
		openssl rand -hex 32 >"$dir/$f"
		echo "wrote $dir/$f"
		;;
	ca.crt | tls.crt | tls.key)
		serving
		;;
	admission-client-ca.crt)
		admission_client
		;;
	*)
		echo "$0: $overlay/kustomization.yaml reads secrets/$f, which this script does not know how to make" >&2
		exit 1
		;;
	esac
done
