#!/usr/bin/env bash
# Project-local Python environment for the compatibility tests and benchmarks against the
# Python reference implementation (az-table-catalog on PyPI).
#
#   scripts/python_env.sh          # create/update .venv-ref/ (gitignored); prints nothing on success
#   scripts/python_env.sh --print  # same, then print the interpreter path
#
# Installs exactly the pins below into .venv-ref/ with the machine's python3 (>= 3.10, the
# reference needs it) and pip. Idempotent: when the venv already has these pins (stamp file
# .venv-ref/.tc-pins) it does nothing, in well under a second. Concurrent callers (test
# binaries run in parallel) are serialised with flock. Output of pip goes to
# .venv-ref/pip-install.log and is only shown when the install fails.
#
# Override the interpreter with TC_PYTHON=/path/to/python3.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-ref"
py="${TC_PYTHON:-python3}"

# The reference and the Azure SDK version it resolves to (2026-11: azure-data-tables 12.7.0,
# azure-core 1.41.0). az-table-catalog itself only asks for azure-data-tables>=12.0.0.
PINS=(
    "az-table-catalog==1.0.1"
    "azure-data-tables==12.7.0"
    "azure-core==1.41.0"
)
stamp_text="$(printf '%s\n' "${PINS[@]}")"

ready() {
    [ -x "$venv/bin/python" ] &&
        [ "$(cat "$venv/.tc-pins" 2>/dev/null)" = "$stamp_text" ] &&
        "$venv/bin/python" -c 'import az_table_catalog.az_table_catalog, azure.data.tables' 2>/dev/null
}

install() {
    if ready; then return 0; fi
    command -v "$py" >/dev/null 2>&1 || { echo "python_env.sh: $py not found (install CPython >= 3.10 with venv and pip)" >&2; return 1; }
    "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' ||
        { echo "python_env.sh: $("$py" --version 2>&1) is too old; the reference needs Python >= 3.10" >&2; return 1; }
    if [ ! -x "$venv/bin/python" ]; then
        "$py" -m venv "$venv" >/dev/null || { echo "python_env.sh: '$py -m venv $venv' failed" >&2; return 1; }
    fi
    rm -f "$venv/.tc-pins"
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}" >"$venv/pip-install.log" 2>&1; then
        echo "python_env.sh: pip install ${PINS[*]} failed:" >&2
        tail -n 30 "$venv/pip-install.log" >&2
        return 1
    fi
    printf '%s\n' "$stamp_text" >"$venv/.tc-pins"
    ready || { echo "python_env.sh: the venv was installed but cannot import the reference" >&2; return 1; }
}

mkdir -p "$venv"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$venv/.tc-lock"
    flock 9
fi
install
if [ "${1:-}" = "--print" ]; then
    echo "$venv/bin/python"
fi
