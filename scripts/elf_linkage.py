#!/usr/bin/env python3
"""Checks that an x86-64 ELF executable runs on any Linux worker image.

    python3 scripts/elf_linkage.py [--max-glibc 2.17] <binary>

Passes (exit 0) when the binary is static (no PT_INTERP program header, no DT_NEEDED entry),
or when it is dynamic but needs no glibc symbol version (GLIBC_x.y in its version needs,
DT_VERNEED) newer than --max-glibc. Fails (exit 1) otherwise, printing the interpreter, the
shared libraries and the newest GLIBC_ version it needs. Reads the ELF itself (ELF64,
little-endian; System V gABI), so no readelf is needed. scripts/package.sh runs it on every
binary it packages; tests/suite/package.rs checks the same with the `object` crate.
"""

import argparse
import struct
import sys

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_VERNEED, DT_VERNEEDNUM = 0, 1, 5, 0x6FFFFFFE, 0x6FFFFFFF


def linkage(data):
    """Returns (interpreter or None, [needed libraries], [version-need names])."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    interp, dynamic, loads = None, None, []
    for i in range(phnum):
        p_type, _flags, off, vaddr, _paddr, filesz, _memsz, _align = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize
        )
        if p_type == PT_INTERP:
            interp = data[off : off + filesz].rstrip(b"\0").decode()
        elif p_type == PT_DYNAMIC:
            dynamic = (off, filesz)
        elif p_type == PT_LOAD:
            loads.append((vaddr, off, filesz))
    if dynamic is None:
        return interp, [], []

    def file_offset(addr):
        for vaddr, off, size in loads:
            if vaddr <= addr < vaddr + size:
                return addr - vaddr + off
        raise ValueError(f"address {addr:#x} is in no PT_LOAD segment")

    entries = []
    off, size = dynamic
    for at in range(off, off + size, 16):
        tag, val = struct.unpack_from("<qQ", data, at)
        if tag == DT_NULL:
            break
        entries.append((tag, val))
    tags = dict(entries)
    strtab = file_offset(tags[DT_STRTAB]) if DT_STRTAB in tags else None

    def string(index):
        end = data.index(b"\0", strtab + index)
        return data[strtab + index : end].decode()

    needed = [string(v) for t, v in entries if t == DT_NEEDED]
    versions = []
    if DT_VERNEED in tags:
        at = file_offset(tags[DT_VERNEED])
        for _ in range(tags.get(DT_VERNEEDNUM, 0)):
            _ver, cnt, _file, aux, nxt = struct.unpack_from("<HHIII", data, at)
            a = at + aux
            for _ in range(cnt):
                _hash, _flags, _other, name, anext = struct.unpack_from("<IHHII", data, a)
                versions.append(string(name))
                a += anext
            if nxt == 0:
                break
            at += nxt
    return interp, needed, versions


def version_key(text):
    return tuple(int(x) for x in text.split("."))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-glibc", default="2.17")
    parser.add_argument("binary")
    args = parser.parse_args()
    with open(args.binary, "rb") as f:
        interp, needed, versions = linkage(f.read())
    glibc = sorted(
        {v[len("GLIBC_") :] for v in versions if v.startswith("GLIBC_") and v[6:7].isdigit()},
        key=version_key,
    )
    if interp is None and not needed:
        print("linkage: static (no interpreter, no shared libraries)")
        return 0
    newest = glibc[-1] if glibc else None
    print(f"linkage: dynamic; interpreter {interp}; needs {' '.join(needed) or 'nothing'}")
    print(f"linkage: newest glibc symbol version GLIBC_{newest}")
    if newest is not None and version_key(newest) > version_key(args.max_glibc):
        print(f"linkage: error: needs glibc {newest}, newer than {args.max_glibc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
