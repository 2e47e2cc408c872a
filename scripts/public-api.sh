#!/usr/bin/env bash
# The public API of each published crate, listed in docs/api/<crate>.txt from the HTML of `cargo doc` (stable
# toolchain): one line per public item, and under each type and trait its public methods and the traits it
# implements. Run it after changing the public surface and commit the listing; `--check` (CI) only compares.
#
#   scripts/public-api.sh [--check] [--no-doc]     (--no-doc: target/doc is already current)
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
doc=1
for a in "$@"; do
  case "$a" in
    --no-doc) doc="" ;;
    *) args+=("$a") ;;
  esac
done
if [ -n "$doc" ]; then
  cargo doc --workspace --all-features --no-deps --quiet
fi
exec python3 scripts/public_api.py "${args[@]}" target/doc
