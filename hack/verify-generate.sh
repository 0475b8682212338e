#!/usr/bin/env bash
# verify-generate.sh fails when regenerating would change a committed generated file: the
# deepcopy code in api/ and the CRDs in deploy/crds. Run it from anywhere inside the repository;
# it regenerates in place, so on failure the working tree holds the fresh output to review and
# commit.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

make generate

status=0
if ! git diff --exit-code -- api deploy/crds; then
	echo "verify-generate: generated files are out of date; run 'make generate' and commit the result" >&2
	status=1
fi

untracked=$(git ls-files --others --exclude-standard -- 'api/*zz_generated*' deploy/crds)
if [ -n "$untracked" ]; then
	echo "verify-generate: generated files are not committed:" >&2
	echo "$untracked" >&2
	status=1
fi

exit "$status"
