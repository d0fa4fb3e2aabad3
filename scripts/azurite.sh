#!/usr/bin/env bash
# Azurite (Azure Storage emulator) for the tests of the `azure` store backend.
#
#   source scripts/azurite.sh start   # install (once) + start; exports the variables below
#   scripts/azurite.sh stop           # stop the instance started from this checkout
#   scripts/azurite.sh status         # print whether it runs
#   scripts/azurite.sh install        # only install the pinned version into .azurite/
#   AZURITE_INSTANCE=name ...         # a separate instance (own pid/env/log files in .azurite/)
#
# `start` exports:
#   TC_TEST_AZURE_CONNECTION  connection string with explicit TableEndpoint/QueueEndpoint
#   AZURITE_TABLE_PORT, AZURITE_QUEUE_PORT, AZURITE_PID
#
# Azurite is pinned (AZURITE_VERSION) and installed with npm into the project-local, gitignored
# folder `.azurite/`; nothing is installed globally. It listens on 127.0.0.1 only, on free ports,
# with in-memory persistence, so every start is a clean, hermetic instance.
#
# The script works both sourced and executed. When sourced it never calls `exit` (that would
# close the caller's shell) and leaves only the exported variables behind.

_azurite_main() {
    local version="${AZURITE_VERSION:-3.37.0}"
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
    local dir="$root/.azurite"
    local bin="$dir/node_modules/.bin/azurite"
    # AZURITE_INSTANCE names a separate instance (its own pid, env and log files), so several
    # can run from one checkout; unset, the one default instance.
    local instance="${AZURITE_INSTANCE:+-$AZURITE_INSTANCE}"
    local pidfile="$dir/azurite$instance.pid"
    local envfile="$dir/azurite$instance.env"
    local logfile="$dir/azurite$instance.log"
    # Well-known development account of the Azure Storage emulators (public, not a secret).
    local account="devstoreaccount1"
    local key="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

    _azurite_install() {
        if [ -x "$bin" ] && [ "$(cat "$dir/.version" 2>/dev/null)" = "$version" ]; then
            return 0
        fi
        command -v npm >/dev/null 2>&1 || { echo "azurite.sh: npm not found (install Node.js >= 18)" >&2; return 1; }
        mkdir -p "$dir" || return 1
        [ -f "$dir/package.json" ] || printf '{\n  "name": "table-catalog-azurite",\n  "private": true\n}\n' >"$dir/package.json"
        echo "azurite.sh: installing azurite@$version into $dir" >&2
        (cd "$dir" && npm install --no-audit --no-fund --save-exact "azurite@$version" >"$dir/npm-install.log" 2>&1) || {
            echo "azurite.sh: npm install failed, see $dir/npm-install.log" >&2
            return 1
        }
        echo "$version" >"$dir/.version"
    }

    _azurite_free_port() {
        if command -v python3 >/dev/null 2>&1; then
            python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
        else
            # Fallback: random high port not currently listening.
            local p
            for _ in $(seq 1 50); do
                p=$((20000 + RANDOM % 40000))
                if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
            done
            return 1
        fi
    }

    _azurite_port_open() {
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
    }

    _azurite_running() {
        [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
    }

    _azurite_export() {
        # shellcheck disable=SC1090
        . "$envfile"
        export AZURITE_TABLE_PORT AZURITE_QUEUE_PORT AZURITE_PID TC_TEST_AZURE_CONNECTION
        echo "AZURITE_PID=$AZURITE_PID"
        echo "AZURITE_TABLE_PORT=$AZURITE_TABLE_PORT"
        echo "AZURITE_QUEUE_PORT=$AZURITE_QUEUE_PORT"
        echo "TC_TEST_AZURE_CONNECTION=$TC_TEST_AZURE_CONNECTION"
    }

    _azurite_start() {
        if _azurite_running && [ -f "$envfile" ]; then
            echo "azurite.sh: already running (pid $(cat "$pidfile"))" >&2
            _azurite_export
            return 0
        fi
        _azurite_install || return 1
        local attempt tport qport bport pid
        for attempt in 1 2 3; do
            tport="$(_azurite_free_port)" && qport="$(_azurite_free_port)" && bport="$(_azurite_free_port)" || return 1
            if [ "$tport" = "$qport" ] || [ "$tport" = "$bport" ] || [ "$qport" = "$bport" ]; then continue; fi
            "$bin" --inMemoryPersistence --silent --skipApiVersionCheck --loose --disableTelemetry \
                --blobHost 127.0.0.1 --queueHost 127.0.0.1 --tableHost 127.0.0.1 \
                --blobPort "$bport" --queuePort "$qport" --tablePort "$tport" \
                </dev/null >"$logfile" 2>&1 &
            pid=$!
            local waited=0
            while [ "$waited" -lt 300 ]; do # up to 30 s
                if ! kill -0 "$pid" 2>/dev/null; then break; fi
                if _azurite_port_open "$tport" && _azurite_port_open "$qport"; then
                    echo "$pid" >"$pidfile"
                    {
                        echo "AZURITE_PID=$pid"
                        echo "AZURITE_TABLE_PORT=$tport"
                        echo "AZURITE_QUEUE_PORT=$qport"
                        echo "TC_TEST_AZURE_CONNECTION='DefaultEndpointsProtocol=http;AccountName=$account;AccountKey=$key;TableEndpoint=http://127.0.0.1:$tport/$account;QueueEndpoint=http://127.0.0.1:$qport/$account;'"
                    } >"$envfile"
                    _azurite_export
                    return 0
                fi
                sleep 0.1
                waited=$((waited + 1))
            done
            kill "$pid" 2>/dev/null
            echo "azurite.sh: start attempt $attempt failed (port race or slow start); log:" >&2
            tail -n 20 "$logfile" >&2 2>/dev/null
        done
        echo "azurite.sh: could not start azurite" >&2
        return 1
    }

    _azurite_stop() {
        if [ ! -f "$pidfile" ]; then
            echo "azurite.sh: not running (no $pidfile)" >&2
            return 0
        fi
        local pid
        pid="$(cat "$pidfile")"
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null
            local i
            for i in $(seq 1 50); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null; fi
            echo "azurite.sh: stopped pid $pid" >&2
        else
            echo "azurite.sh: pid $pid was not running" >&2
        fi
        rm -f "$pidfile" "$envfile"
    }

    case "${1:-}" in
        start) _azurite_start ;;
        stop) _azurite_stop ;;
        install) _azurite_install ;;
        status)
            if _azurite_running; then echo "running (pid $(cat "$pidfile"))"; else echo "not running"; return 1; fi
            ;;
        *)
            echo "usage: source scripts/azurite.sh start | scripts/azurite.sh {start|stop|status|install}" >&2
            return 2
            ;;
    esac
}

_azurite_cleanup() {
    unset -f _azurite_install _azurite_free_port _azurite_port_open _azurite_running \
        _azurite_export _azurite_start _azurite_stop _azurite_main _azurite_cleanup
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    _azurite_main "$@"
    exit $?
else
    _azurite_main "$@"
    _azurite_rc=$?
    _azurite_cleanup
    eval "unset _azurite_rc; return $_azurite_rc"
fi
