#!/usr/bin/env bash
# Builds the Azure Functions deployment package of TableCatalog.
#
#   scripts/package.sh        # prints the path of <out>/table-catalog-functions.zip on stdout
#
# The zip holds, at its root: host.json, the release binary `table-catalog` (mode 0755, the
# name host.json's customHandler.description.defaultExecutablePath gives) and one folder per
# function with its function.json (functions/<name>/function.json becomes <name>/function.json).
# local.settings.json is not packaged: it is for local runs only, Azure uses app settings.
#
# Target: x86_64-unknown-linux-musl (static, runs on any Linux worker) when that Rust target is
# installed; otherwise x86_64-unknown-linux-gnu, linked dynamically against the build machine's
# glibc, and the script reports the newest glibc symbol version the binary needs and any other
# shared library it loads. A binary built on Debian 12 (glibc 2.36) needs glibc >= 2.34, so it
# does not start on a Debian 11 based Functions image (glibc 2.31); while the HTTP client links
# OpenSSL dynamically it also needs libssl.so.3. See docs/FUNCTIONS.md, "Package".
#
# Environment:
#   TC_PACKAGE_OUT        output folder (default: <repo>/dist); its `package/` subfolder is the
#                         staged zip content and is recreated on each run
#   TC_PACKAGE_TARGET     Rust target triple, overrides the choice above
#   TC_PACKAGE_MAX_GLIBC  fail when a glibc build needs a newer glibc than this (e.g. 2.31)
#   TC_PACKAGE_BINARY     package this prebuilt binary instead of building a release one
#   CARGO_TARGET_DIR      honoured (the build output location is read from `cargo metadata`)
#
# Needs: cargo, python3 (zip writing; no `zip` binary required), readelf (optional, for the
# linkage report).

set -euo pipefail

die() {
    echo "package: error: $*" >&2
    exit 1
}
note() {
    echo "package: $*" >&2
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin_name="table-catalog"
out="${TC_PACKAGE_OUT:-$root/dist}"
zip_path="$out/table-catalog-functions.zip"
stage="$out/package"
musl="x86_64-unknown-linux-musl"
gnu="x86_64-unknown-linux-gnu"

command -v cargo >/dev/null || die "cargo not found"
command -v python3 >/dev/null || die "python3 not found (it writes the zip)"

# host.json must start the binary this script packages, in handler mode.
python3 - "$root/host.json" "$bin_name" <<'PY' || die "host.json does not start ./$bin_name handler"
import json, sys
host = json.load(open(sys.argv[1]))
desc = host["customHandler"]["description"]
assert desc["defaultExecutablePath"] == sys.argv[2], desc
assert desc.get("arguments") == ["handler"], desc
PY

target="${TC_PACKAGE_TARGET:-}"
if [[ -z "$target" ]]; then
    if command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
        target="$musl"
    else
        target="$gnu"
        note "the $musl target is not installed (and rustup cannot download it here);"
        note "building $target instead: dynamically linked against this machine's glibc"
    fi
fi

if [[ -n "${TC_PACKAGE_BINARY:-}" ]]; then
    # Package an already built binary (the test suite passes its own build, so CI checks the
    # layout and the handler start without a second, release build).
    binary="$TC_PACKAGE_BINARY"
    note "packaging the prebuilt $binary (not a release build)"
else
    note "building $bin_name (release, $target)"
    (cd "$root" && cargo build --release --target "$target" --bin "$bin_name") >&2
    target_dir="$(cd "$root" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
    binary="$target_dir/$target/release/$bin_name"
fi
[[ -f "$binary" ]] || die "build produced no $binary"

# Linkage report: a static binary has no NEEDED entries; a glibc one needs a minimum glibc.
if command -v readelf >/dev/null; then
    needed="$(readelf -d "$binary" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
    if [[ -z "$needed" ]]; then
        note "linkage: static (no shared libraries needed)"
    else
        glibc="$(readelf -V "$binary" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -n 1)"
        note "linkage: dynamic; needs ${needed}"
        note "linkage: needs glibc >= ${glibc:-unknown} on the Functions worker"
        # Libraries outside glibc and libgcc must come from the worker image too.
        extra=""
        for lib in $needed; do
            case "$lib" in
                libc.so.* | libm.so.* | libgcc_s.so.* | ld-linux-*.so.* | libpthread.so.* | libdl.so.* | librt.so.*) ;;
                *) extra="$extra $lib" ;;
            esac
        done
        if [[ -n "$extra" ]]; then
            note "warning: also needs${extra} from the worker image (libssl.so.3 = OpenSSL 3: Debian 12, Ubuntu 22.04 or newer)"
        fi
        if [[ -n "${TC_PACKAGE_MAX_GLIBC:-}" && -n "$glibc" ]]; then
            newest="$(printf '%s\n%s\n' "$glibc" "$TC_PACKAGE_MAX_GLIBC" | sort -V | tail -n 1)"
            [[ "$newest" == "$TC_PACKAGE_MAX_GLIBC" ]] ||
                die "the binary needs glibc $glibc, newer than TC_PACKAGE_MAX_GLIBC=$TC_PACKAGE_MAX_GLIBC"
        fi
    fi
else
    note "linkage: readelf not found, not checked"
fi

# Stage the zip content: everything at the root, function folders directly under it.
mkdir -p "$out"
rm -rf "$stage" "$zip_path"
mkdir -p "$stage"
install -m 0644 "$root/host.json" "$stage/host.json"
install -m 0755 "$binary" "$stage/$bin_name"
count=0
for dir in "$root"/functions/*/; do
    name="$(basename "$dir")"
    [[ -f "$dir/function.json" ]] || continue
    mkdir -p "$stage/$name"
    install -m 0644 "$dir/function.json" "$stage/$name/function.json"
    count=$((count + 1))
done
[[ "$count" -gt 0 ]] || die "no functions/*/function.json found"

# Deterministic zip: sorted entries, fixed timestamps, Unix modes kept (the host runs the
# binary directly, so its execute bit must survive; zips made on Windows lose it).
python3 - "$stage" "$zip_path" <<'PY'
import os, stat, sys, zipfile
stage, out = sys.argv[1], sys.argv[2]
entries = []
for dirpath, dirnames, filenames in os.walk(stage):
    for f in filenames:
        full = os.path.join(dirpath, f)
        entries.append((os.path.relpath(full, stage).replace(os.sep, "/"), full))
entries.sort()
tmp = out + ".tmp"
with zipfile.ZipFile(tmp, "w") as z:
    for rel, full in entries:
        mode = stat.S_IMODE(os.stat(full).st_mode)
        info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
        info.create_system = 3  # Unix: external_attr carries the file mode
        info.external_attr = (stat.S_IFREG | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        with open(full, "rb") as fh:
            z.writestr(info, fh.read(), compresslevel=9)
os.replace(tmp, out)
PY

note "wrote $zip_path ($(wc -c <"$zip_path") bytes, $count functions, target $target)"
echo "$zip_path"
