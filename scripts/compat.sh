#!/usr/bin/env bash
# Mixed versions against a real older build (issue 27, item 6): today's binary and the binary
# of a pinned older commit on the same embedded catalog, in both directions.
#
#   scripts/compat.sh [COMMIT]          # default f9c09a6 (the build tests/data/compat/ was written by)
#
# 1. Builds COMMIT in a git worktree of its own with its own target dir (both reused when
#    present), and today's binary (`cargo build --release --bin table-catalog` here).
# 2. New -> old: today's build creates an embedded catalog `airports` (index keys icao,iata,lid,
#    row key name) with the first COMPAT_RECORDS airports of data/airports.csv and runs
#    `index add country`. Then the OLD build opens that catalog: a lookup, then an upsert.
#    lookup and upsert once with the schema configured (TABLE_CATALOG_INDEX_KEYS, as a deployed
#    process has it) and once without. The old build must refuse (README: "an older release
#    refuses to open a catalog whose indexes changed, configured or not"). FAIL when an old
#    upsert succeeds or the store's content changed (every SQLite table, compared row by row
#    before and after the old build ran); an old lookup that answers is reported, not failed.
# 3. Old -> new: the OLD build creates the catalog tests/data/compat/README.md describes
#    (import, 00AK upserted twice, 00AA deleted, recover); today's build opens it: `verify`
#    must be clean, an upsert must succeed and be found, and `verify` must stay clean. The
#    same checks run on copies of the checked-in fixtures tests/data/compat/COMMIT/ and
#    COMMIT-pending/ (an old-format WAL entry left pending: today's `recover` applies it) when
#    they exist; the fixtures are never opened in place.
# Prints every command's exit status and output, then a summary. Exits 0 when every check
# passes, 1 when one fails, 2 on a usage or build error.
#
# Settings (environment):
#   COMPAT_WORKTREE   the older commit's worktree (default ${TMPDIR:-/tmp}/table-catalog-compat-COMMIT)
#   COMPAT_TARGET     its cargo target dir (default COMPAT_WORKTREE/target)
#   COMPAT_PROFILE    release (default) or debug, for the older build
#   COMPAT_DIR        where the catalogs are written (default: a new temporary folder, kept)
#   COMPAT_RECORDS    airports imported (200)
#   TC_NEW_BIN        today's binary: skip building it here
#   TC_OLD_BIN        the older binary: skip the worktree and its build
# Remove the worktree with `git worktree remove --force COMPAT_WORKTREE`.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
commit="${1:-f9c09a6}"
if ! full="$(git rev-parse --verify --quiet "$commit^{commit}")"; then
    echo "compat: unknown commit '$commit'" >&2
    exit 2
fi
short="$(git rev-parse --short=7 "$full")"
records="${COMPAT_RECORDS:-200}"
profile="${COMPAT_PROFILE:-release}"
airports="$repo/data/airports.csv"
[ -s "$airports" ] || { echo "compat: $airports missing" >&2; exit 2; }

# --- builds -----------------------------------------------------------------------------------
if [ -n "${TC_OLD_BIN:-}" ]; then
    old_bin="$TC_OLD_BIN"
else
    wt="${COMPAT_WORKTREE:-${TMPDIR:-/tmp}/table-catalog-compat-$short}"
    old_target="${COMPAT_TARGET:-$wt/target}"
    if [ -d "$wt" ]; then
        head="$(git -C "$wt" rev-parse HEAD 2>/dev/null || true)"
        if [ "$head" != "$full" ]; then
            echo "compat: $wt exists but is not a worktree at $short (HEAD ${head:-none}); remove it or set COMPAT_WORKTREE" >&2
            exit 2
        fi
        echo "compat: reusing worktree $wt" >&2
    else
        git worktree add --detach "$wt" "$full" >&2
    fi
    flag=(--release)
    [ "$profile" = "debug" ] && flag=()
    echo "compat: building $short ($profile) in $wt, target $old_target" >&2
    (cd "$wt" && CARGO_TARGET_DIR="$old_target" cargo build "${flag[@]}" --bin table-catalog) >&2 || exit 2
    old_bin="$old_target/$profile/table-catalog"
fi
if [ -n "${TC_NEW_BIN:-}" ]; then
    new_bin="$TC_NEW_BIN"
else
    echo "compat: building today's binary (release)" >&2
    cargo build --release --bin table-catalog >&2 || exit 2
    new_bin="${CARGO_TARGET_DIR:-$repo/target}/release/table-catalog"
fi
for b in "$old_bin" "$new_bin"; do
    [ -x "$b" ] || { echo "compat: no binary at $b" >&2; exit 2; }
done
if [ -n "${TC_NEW_BIN:-}" ]; then
    today="TC_NEW_BIN"
else
    today="$(git rev-parse --short=7 HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock || echo +changes)"
fi

work="${COMPAT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/compat.XXXXXX")}"
mkdir -p "$work"
head -n "$((records + 1))" "$airports" >"$work/airports-$records.csv"
echo "compat: old = $short ($old_bin), new = $today ($new_bin), catalogs under $work"

schema=(--name airports --index-keys icao,iata,lid --row-key name)
old() { "$old_bin" --local-path "$1" "${schema[@]}" "${@:2}"; }
old_bare() { "$old_bin" --local-path "$1" --name airports "${@:2}"; }   # schema read from the catalog
new() { "$new_bin" --local-path "$1" "${schema[@]}" "${@:2}"; }

# Runs one command, printing it, its exit status and its output (indented); sets $rc and $out.
step() { # label command...
    local label="$1"
    shift
    set +e
    out="$("$@" 2>&1)"
    rc=$?
    set -e
    printf '\n$ [%s] %s\n  exit %s\n' "$label" "${*:2}" "$rc"
    [ -n "$out" ] && printf '%s\n' "$out" | head -n 20 | sed 's/^/  | /'
    return 0
}

# The logical content of the store (every table, every row, sorted), as one digest; the
# catalog folder's catalog.sqlite3 is read-only here (WAL files included).
digest() { # dir
    python3 - "$1/catalog.sqlite3" <<'EOF'
import hashlib, sqlite3, sys
con = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
con.create_collation("UTF16", lambda a, b: (a.encode("utf-16-be") > b.encode("utf-16-be")) - (a.encode("utf-16-be") < b.encode("utf-16-be")))
h = hashlib.sha256()
for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"):
    rows = sorted(repr(r) for r in con.execute(f'SELECT * FROM "{name}"'))
    h.update(f"{name}:{len(rows)}\n".encode())
    for r in rows:
        h.update(r.encode() + b"\n")
print(h.hexdigest()[:16])
EOF
}

failures=()
results=()
check() { # ok|FAIL text
    results+=("$1  $2")
    [ "$1" = ok ] || failures+=("$2")
}

# --- 1. new -> old ------------------------------------------------------------------------------
echo
echo "=== new -> old: today's build creates the catalog and adds an index; $short opens it ==="
a="$work/new-catalog"
rm -rf "$a"
step new new "$a" import --file "$work/airports-$records.csv"
[ "$rc" = 0 ] || { echo "compat: today's import failed" >&2; exit 2; }
step new new "$a" index add country
[ "$rc" = 0 ] || { echo "compat: today's index add failed" >&2; exit 2; }
step new new "$a" index list
before="$(digest "$a")"
step "old $short" old "$a" query icao=00AK
q1=$rc
step "old $short" old "$a" insert --upsert '{"icao":"ZZCO","iata":"ZZC","lid":"ZZCO","name":"Compat Old Field","country":"XC","elevation":1}'
u1=$rc
step "old $short, unconfigured" old_bare "$a" query icao=00AK
q2=$rc
step "old $short, unconfigured" old_bare "$a" insert --upsert '{"icao":"ZZCU","iata":"ZZU","lid":"ZZCU","name":"Compat Old Unconfigured","country":"XC","elevation":1}'
u2=$rc
after="$(digest "$a")"
echo
echo "  store digest before the old build: $before, after: $after"
changed=unchanged
[ "$before" = "$after" ] || changed=changed
if [ "$u1" = 0 ] || [ "$u2" = 0 ] || [ "$changed" = changed ]; then
    check FAIL "new->old: $short wrote to a catalog with an added index (upsert exit $u1 configured, $u2 unconfigured; store $changed; lookups exit $q1, $q2)"
    # What today's build makes of it (informational).
    step new new "$a" query icao=ZZCO
    step new new "$a" query country=XC
    step new new "$a" verify
else
    answered=""
    { [ "$q1" = 0 ] || [ "$q2" = 0 ]; } && answered=" (but a lookup answered: exit $q1 configured, $q2 unconfigured)"
    check ok "new->old: $short refused every upsert (exit $u1, $u2), store unchanged$answered"
fi

# --- 2. old -> new ------------------------------------------------------------------------------
old_to_new() { # label dir
    local label="$1" d="$2"
    step new new "$d" verify
    if [ "$rc" != 0 ]; then
        check FAIL "old->new ($label): verify before a write: exit $rc"
        return
    fi
    step new new "$d" insert --upsert '{"icao":"ZZCN","iata":"ZZN","lid":"ZZCN","name":"Compat New Field","country":"XC","elevation":2}'
    local up=$rc
    step new new "$d" query icao=ZZCN
    local found=$out
    step new new "$d" verify
    local v=$rc
    if [ "$up" = 0 ] && [ "$v" = 0 ] && [[ "$found" == *'"Compat New Field"'* ]]; then
        check ok "old->new ($label): verify clean, upsert applied and found, verify clean after"
    else
        check FAIL "old->new ($label): upsert exit $up, found: $([[ "$found" == *Compat* ]] && echo yes || echo no), verify after exit $v"
    fi
}

echo
echo "=== old -> new: $short creates the catalog; today's build opens it ==="
b="$work/old-catalog"
rm -rf "$b"
step "old $short" old "$b" import --file "$work/airports-$records.csv"
[ "$rc" = 0 ] || { echo "compat: the old build's import failed" >&2; exit 2; }
lowell='{"city":"Anchor Point","country":"US","elevation":ELEV,"iata":"","icao":"00AK","lat":59.948889,"lid":"00AK","lon":-151.692222,"name":"Lowell Field","subd":"Alaska","tz":"America/Anchorage"}'
step "old $short" old "$b" insert --upsert "${lowell/ELEV/255}"
step "old $short" old "$b" insert --upsert "${lowell/ELEV/260}"
step "old $short" old "$b" delete icao=00AA
step "old $short" old "$b" recover

# The lookups tests/data/compat/README.md lists, with today's build.
old_catalog_reads() { # label dir
    local label="$1" d="$2" q0 q1
    step new new "$d" query icao=00AK
    q0=$out
    step new new "$d" query icao=00AA
    q1=$out
    if [[ "$q0" == *'"elevation":260'* ]] && [[ "$q1" != *'"icao"'* ]]; then
        check ok "old->new ($label): icao=00AK is the second upsert (elevation 260), icao=00AA is deleted"
    else
        check FAIL "old->new ($label): icao=00AK / icao=00AA do not read as the old build left them"
    fi
}
old_catalog_reads "fresh" "$b"
old_to_new "fresh" "$b"

fixtures="$repo/tests/data/compat"
if [ -f "$fixtures/$short/catalog.sqlite3" ]; then
    echo
    echo "=== old -> new: the checked-in fixture tests/data/compat/$short (a copy) ==="
    c="$work/fixture-copy"
    rm -rf "$c"
    mkdir -p "$c"
    cp "$fixtures/$short/catalog.sqlite3" "$c/"
    old_catalog_reads "fixture" "$c"
    old_to_new "fixture" "$c"
fi
if [ -f "$fixtures/$short-pending/catalog.sqlite3" ]; then
    echo
    echo "=== old -> new: tests/data/compat/$short-pending (a copy): an old-format WAL entry left pending ==="
    c="$work/fixture-pending-copy"
    rm -rf "$c"
    mkdir -p "$c"
    cp "$fixtures/$short-pending/catalog.sqlite3" "$c/"
    step new new "$c" status
    step new new "$c" recover
    step new new "$c" query icao=ZZOL
    if [[ "$out" == *'"Old Pending Field"'* ]]; then
        check ok "old->new (pending fixture): today's recover applied the old build's pending upsert"
    else
        check FAIL "old->new (pending fixture): icao=ZZOL not found after today's recover"
    fi
    old_to_new "pending fixture" "$c"
fi

echo
echo "=== summary: old $short, new $today ==="
printf '%s\n' "${results[@]}"
if [ "${#failures[@]}" -gt 0 ]; then
    echo "compat: ${#failures[@]} check(s) failed"
    exit 1
fi
echo "compat: every check passed"
