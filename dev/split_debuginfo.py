"""Makes a built kolo wheel lean: moves the debug info and the symbol table of its native module
(``kolo/_native*.so``) into a separate file beside the wheel and rewrites the wheel with the
stripped module (its RECORD hash and size updated).

Usage: ``python dev/split_debuginfo.py WHEEL...``

For each wheel ``dist/kolo-<v>-<tags>.whl`` the debug file is
``dist/kolo-<v>-<tags>.debug/<module>.debug`` (the name the stripped module's
``.gnu_debuglink`` section asks for; the module keeps its GNU build-id, which the debug file
shares). Put that file next to the installed ``_native.abi3.so`` (or in
``/usr/lib/debug/.build-id/<xx>/<rest>.debug``) and gdb, and Rust's own backtraces, resolve
kolo's frames to functions, files and lines again (docs/install.md, "Symbols for crash reports").

The cargo profile stays the one the whole project builds with (``[profile.release]``, line
tables for kolo's crates): stripping after the build, rather than in a second profile, means the
wheel is made from the very artifacts ``maturin develop`` and ``cargo test`` already compiled.
A wheel whose module has no debug info left is skipped (running this twice is harmless).
Needs binutils' ``objcopy`` and ``readelf``; a module built for another architecture (the
cross-compiled aarch64 wheel) needs that architecture's objcopy
(``apt-get install binutils-aarch64-linux-gnu``) or ``llvm-objcopy``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

#: ELF ``e_machine`` values of the architectures kolo ships wheels for.
ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64"}


def _objcopy_for(so_path: str) -> str:
    """An objcopy that understands ``so_path``'s architecture: the host's own ``objcopy`` for a
    module of the host's architecture, else ``<arch>-linux-gnu-objcopy`` or ``llvm-objcopy``."""
    with open(so_path, "rb") as f:
        header = f.read(20)
    machine = ELF_MACHINES.get(int.from_bytes(header[18:20], "little"))
    if machine is None or machine == os.uname().machine:
        return "objcopy"
    for candidate in (f"{machine}-linux-gnu-objcopy", "llvm-objcopy"):
        found = shutil.which(candidate)
        if found:
            return found
    raise SystemExit(
        f"{so_path} is a {machine} module: install binutils-{machine}-linux-gnu (its "
        f"{machine}-linux-gnu-objcopy) or llvm-objcopy to split its debug info"
    )


def _has_debug_info(path: str) -> bool:
    sections = subprocess.run(
        ["readelf", "-S", "-W", path], check=True, capture_output=True, text=True
    ).stdout
    return ".debug_info" in sections or ".symtab" in sections


def _build_id(path: str) -> str:
    notes = subprocess.run(
        ["readelf", "-n", path], check=True, capture_output=True, text=True
    ).stdout
    for line in notes.splitlines():
        if "Build ID:" in line:
            return line.split("Build ID:", 1)[1].strip()
    return "none"


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def split_wheel(wheel: str) -> None:
    """Strips the native module inside ``wheel`` (rewritten in place) and writes its debug file
    to ``<wheel without .whl>.debug/<module>.debug``."""
    with zipfile.ZipFile(wheel) as zin:
        modules = [n for n in zin.namelist() if n.startswith("kolo/_native") and n.endswith(".so")]
        if len(modules) != 1:
            raise SystemExit(f"{wheel}: expected one kolo/_native*.so, found {modules}")
        module = modules[0]
        records = [n for n in zin.namelist() if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise SystemExit(f"{wheel}: expected one .dist-info/RECORD, found {records}")
        record = records[0]
        with tempfile.TemporaryDirectory() as tmp:
            so_path = os.path.join(tmp, os.path.basename(module))
            with zin.open(module) as src, open(so_path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            before = os.path.getsize(so_path)
            if not _has_debug_info(so_path):
                print(f"{wheel}: {module} has no debug info or symbols left; unchanged")
                return
            if _build_id(so_path) == "none":
                # Without it a crash report cannot be matched to its debug file (zig's linker
                # adds none unless asked: dev/build-release.sh passes -Wl,--build-id).
                raise SystemExit(f"{wheel}: {module} has no GNU build-id; link it with --build-id")
            debug_dir = wheel[: -len(".whl")] + ".debug"
            os.makedirs(debug_dir, exist_ok=True)
            debug_name = os.path.basename(module) + ".debug"
            debug_path = os.path.join(tmp, debug_name)
            objcopy = _objcopy_for(so_path)
            subprocess.run([objcopy, "--only-keep-debug", so_path, debug_path], check=True)
            # --strip-all keeps the dynamic symbol table (PyInit__native and the imports); the
            # debuglink records the debug file's name and CRC for gdb and Rust's backtraces.
            subprocess.run(
                [objcopy, "--strip-all", f"--add-gnu-debuglink={debug_path}", so_path],
                check=True,
            )
            with open(so_path, "rb") as f:
                stripped = f.read()
            out_path = wheel + ".tmp"
            with zipfile.ZipFile(out_path, "w", zipfile.ZIP_DEFLATED) as zout:
                for info in zin.infolist():
                    if info.filename == module:
                        data = stripped
                    elif info.filename == record:
                        data = _rewrite_record(zin.read(record), module, stripped)
                    else:
                        data = zin.read(info)
                    zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            shutil.move(debug_path, os.path.join(debug_dir, debug_name))
    os.replace(out_path, wheel)
    print(
        f"{wheel}: {module} {before / 1e6:.1f} MB -> {len(stripped) / 1e6:.1f} MB "
        f"(build-id {_build_id(os.path.join(debug_dir, debug_name))}); wheel "
        f"{os.path.getsize(wheel) / 1e6:.1f} MB; debug info in "
        f"{os.path.join(debug_dir, debug_name)}"
    )


def _rewrite_record(text: bytes, module: str, data: bytes) -> bytes:
    lines = []
    for line in text.decode().splitlines():
        if line.split(",", 1)[0] == module:
            line = f"{module},{_record_hash(data)},{len(data)}"
        lines.append(line)
    return ("\n".join(lines) + "\n").encode()


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for wheel in argv:
        split_wheel(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
