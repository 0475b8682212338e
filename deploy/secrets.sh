#!/usr/bin/env bash
# secrets.sh OVERLAY_DIR: writes the credential files an overlay's secretGenerators read, into
# OVERLAY_DIR/secrets/ (ignored by Git), so that `kubectl apply -k OVERLAY_DIR` finds them. Only
# the files the overlay's kustomization.yaml names (secrets/<file>) are made, and a file that
# exists is left alone: run it again after adding a component, or delete a file to make it anew.
# An overlay built on another (resources: ../quickstart) reads that one's files too: run the
# script on both.
#
#   redis-password, audit-token, admission-token   32 random bytes, hex (openssl rand -hex 32)
#   secret-digest-key                              the same: the key of the digests of Secrets'
#                                                  writes (deploy/components/secret-digest-key)
#
# No certificate: the overlays' TLS is kubescribe's own (deploy/components/self-managed-tls) or
# cert-manager's. Nothing here is sent anywhere; keep the folder as you would keep the
# credentials (docs/install.md).
set -euo pipefail

if [ $# -ne 1 ] || [ ! -f "$1/kustomization.yaml" ]; then
	echo "usage: $0 OVERLAY_DIR (a folder with a kustomization.yaml, e.g. deploy/overlays/quickstart)" >&2
	exit 2
fi
overlay=$1
dir=$overlay/secrets
umask 077
mkdir -p "$dir"

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
	redis-password | audit-token | admission-token | secret-digest-key)
		openssl rand -hex 32 >"$dir/$f"
		echo "wrote $dir/$f"
		;;
	*)
		echo "$0: $overlay/kustomization.yaml reads secrets/$f, which this script does not know how to make" >&2
		case $f in
		*.crt | *.key)
			echo "(certificates: let kubescribe make its own with deploy/components/self-managed-tls, or use cert-manager: docs/install.md)" >&2
			;;
		esac
		exit 1
		;;
	esac
done
