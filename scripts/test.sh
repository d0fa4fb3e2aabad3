#!/usr/bin/env bash
# Runs every test of the project, on a fresh machine, with nothing installed by hand:
#   - installs a pinned Azurite with npm into .azurite/ and starts it on loopback ports;
#   - runs the whole cargo test suite (unit, conformance and integration tests on the
#     embedded store and on Azurite, the Functions contract harness, the package check),
#     with the fault-injection hooks compiled in;
#   - stops Azurite at the end, whether the tests passed or not.
# Usage: scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/azurite.sh
source scripts/azurite.sh start >/dev/null
trap 'scripts/azurite.sh stop >/dev/null 2>&1 || true' EXIT

export TC_TEST_PACKAGE="${TC_TEST_PACKAGE:-1}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
cargo test --features fault-injection --no-fail-fast "$@"
