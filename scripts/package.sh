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
# Target: x86_64-unknown-linux-musl, a static binary (no ELF interpreter, no shared library)
# that runs on any Linux worker image whatever its glibc. The script installs what that needs:
# the Rust target (`rustup target add`) and a C compiler for musl (the bundled SQLite and ring are
# C): `musl-gcc` from Debian's `musl-tools` (apt-get, when running as root), else `cargo-zigbuild`
# with Zig from PyPI (`pip install ziglang`); when neither can be had it fails. Where musl
# cannot work, TC_PACKAGE_TARGET=x86_64-unknown-linux-gnu.2.17 builds with cargo-zigbuild
# against glibc 2.17. The binary needs no OpenSSL (the HTTP clients use rustls). Whatever the target, the
# packaged binary is checked before it is zipped: static, or needing no glibc symbol newer than
# 2.17; any other result fails loudly (never a binary that needs a newer glibc).
#
# Environment:
#   TC_PACKAGE_OUT        output folder (default: <repo>/dist); its `package/` subfolder is the
#                         staged zip content and is recreated on each run
#   TC_PACKAGE_TARGET     Rust target triple (default x86_64-unknown-linux-musl); a
#                         `x86_64-unknown-linux-gnu.2.17` style target builds with cargo-zigbuild
#   TC_PACKAGE_PROFILE    cargo profile of the build (default `release`, what a deployment gets);
#                         the test command's package check uses `package-check` (Cargo.toml: the
#                         release profile without optimisation, for build time only)
#   TC_PACKAGE_BINARY     package this prebuilt binary instead of building a release one (it must
#                         pass the same linkage check)
#   CARGO_TARGET_DIR      honoured (the build output location is read from `cargo metadata`)
#   TC_PACKAGE_TARGET_DIR the build's target folder, overriding CARGO_TARGET_DIR for this build
#                         only (scripts/test.sh builds the package check's binary in its own
#                         folder, beside the test build, so the two builds do not wait on one
#                         cargo lock)
#
# Needs: cargo, rustup, python3 (zip writing and the ELF check; no `zip` or `readelf` needed).

set -euo pipefail

die() {
    echo "package: error: $*" >&2
    exit 1
}
note() {
    echo "package: $*" >&2
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${TC_PACKAGE_TARGET_DIR:-}" ]]; then
    export CARGO_TARGET_DIR="$TC_PACKAGE_TARGET_DIR"
fi
# Set when this script runs inside `cargo test` (the package check). ring's build script
# reruns when it changes, so a build made from a shell would be rebuilt from the test (and
# the other way round): ring and everything above it, 2.5 minutes on 2 cores.
unset CARGO_MANIFEST_DIR
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

target="${TC_PACKAGE_TARGET:-$musl}"
max_glibc="2.17"

# A C compiler for musl: musl-gcc (Debian's musl-tools), installed here when we are root.
have_musl_gcc() {
    command -v musl-gcc >/dev/null || command -v x86_64-linux-musl-gcc >/dev/null
}
install_musl_gcc() {
    have_musl_gcc && return 0
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        note "installing musl-tools (musl-gcc) with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q musl-tools >&2 ||
            { DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 &&
                DEBIAN_FRONTEND=noninteractive apt-get install -y -q musl-tools >&2; } ||
            note "apt-get could not install musl-tools"
    fi
    have_musl_gcc
}
# cargo-zigbuild with Zig from PyPI: the other way to get a C toolchain for musl or old glibc.
install_zigbuild() {
    if ! command -v zig >/dev/null && ! python3 -c 'import ziglang' 2>/dev/null; then
        note "installing Zig (pip install ziglang)"
        python3 -m pip install --quiet ziglang >&2 ||
            python3 -m pip install --quiet --break-system-packages ziglang >&2 || return 1
    fi
    if ! command -v cargo-zigbuild >/dev/null; then
        note "installing cargo-zigbuild"
        cargo install --locked cargo-zigbuild >&2 || return 1
    fi
}

rust_target="${target%%.*}" # x86_64-unknown-linux-gnu.2.17 -> x86_64-unknown-linux-gnu
profile="${TC_PACKAGE_PROFILE:-release}"
[[ "$profile" =~ ^[a-z][a-z0-9-]*$ ]] || die "TC_PACKAGE_PROFILE: '$profile' is not a cargo profile name"
build=(cargo build)
if [[ -n "${TC_PACKAGE_BINARY:-}" ]]; then
    # Package an already built binary; it gets the same linkage check as a fresh build.
    binary="$TC_PACKAGE_BINARY"
    note "packaging the prebuilt $binary (not a release build)"
else
    command -v rustup >/dev/null || die "rustup not found (it installs the $rust_target target)"
    if ! rustup target list --installed | grep -qx "$rust_target"; then
        note "installing the Rust target $rust_target"
        rustup target add "$rust_target" >&2 || die "rustup target add $rust_target failed"
    fi
    if [[ "$target" == "$musl" ]]; then
        if ! install_musl_gcc; then
            install_zigbuild || die "no C compiler for $musl: install musl-tools (musl-gcc) or cargo-zigbuild + ziglang; or set TC_PACKAGE_TARGET=$gnu.2.17"
            build=(cargo zigbuild)
        fi
    elif [[ "$target" != "$rust_target" ]]; then
        install_zigbuild || die "$target needs cargo-zigbuild and ziglang, which could not be installed"
        build=(cargo zigbuild)
    fi
    note "building $bin_name (profile $profile, $target, ${build[*]})"
    (cd "$root" && "${build[@]}" --profile "$profile" --target "$target" --bin "$bin_name") >&2 ||
        die "${build[*]} --profile $profile --target $target failed"
    target_dir="$(cd "$root" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
    binary="$target_dir/$rust_target/$profile/$bin_name"
fi
[[ -f "$binary" ]] || die "build produced no $binary"

# Linkage check (scripts/elf_linkage.py): static, or no glibc symbol newer than 2.17.
python3 "$root/scripts/elf_linkage.py" --max-glibc "$max_glibc" "$binary" >&2 ||
    die "$binary would not run on every Functions worker image (see above); not packaged"

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
