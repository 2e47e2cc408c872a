#!/usr/bin/env bash
# Regenerates the checked-in code from the protos (protox: no system protoc) and fails if it drifted.
# Run by hand after editing a .proto; not part of CI, so CI never compiles protox.
set -euo pipefail
cd "$(dirname "$0")/../../.."
# Its own target dir (ignored by git): the generator is not a workspace member and shares no build with it.
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-grpc-codegen}" cargo run --quiet --manifest-path crates/tollgate-grpc/codegen/Cargo.toml
git diff --exit-code -- 'crates/tollgate-grpc/proto/*.rs'
echo "generated code is up to date"
