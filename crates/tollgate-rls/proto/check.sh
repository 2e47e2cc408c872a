#!/usr/bin/env bash
# Regenerates the checked-in code from the protos (protox: no system protoc) and fails if it drifted.
# Run by hand after editing a .proto; not part of CI, so CI never compiles protox.
set -euo pipefail
cd "$(dirname "$0")/../../.."
# Its own target dir (ignored by git): the generator is not a workspace member and shares no build with it.
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-rls-codegen}" cargo run --quiet --manifest-path crates/tollgate-rls/codegen/Cargo.toml
git diff --exit-code -- 'crates/tollgate-rls/src/proto/*.rs'
git ls-files --others --exclude-standard --error-unmatch -- 'crates/tollgate-rls/src/proto/*.rs' >/dev/null 2>&1 \
  && { echo "untracked generated files in crates/tollgate-rls/src/proto" >&2; exit 1; }
echo "generated code is up to date"
