"""Copies the Python code buf generates (gen/python) into the package, under its own namespace.

buf generate writes top-level packages named after the protos' packages:
turnstile.v1 and google.rpc. The package ships them as turnstile_client.v1
and turnstile_client._rpc, so it installs no top-level package but its own
(a top-level google.rpc would be googleapis-common-protos' place). The copy
is gen/python's files byte for byte but for their module names: their
imports of one another ("from turnstile.v1 import" becomes "from
turnstile_client.v1 import") and the module their classes name as theirs.

    python3 clients/python/copy_gen.py          # after buf generate
    python3 clients/python/copy_gen.py --check  # CI: fails when the copy is stale
"""

from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
GEN = HERE.parents[1] / "gen" / "python"
#: The licence of google.rpc's protos, which ships with their generated code.
RPC_LICENSE = HERE.parents[1] / "proto" / "google" / "rpc" / "LICENSE"
PKG = HERE / "turnstile_client"

#: Where each generated package goes in the package.
DIRS = {"turnstile/v1": "v1", "google/rpc": "_rpc"}

INIT = {
    "v1": '"""turnstile.v1\'s messages and service stub, as buf generates them (copy_gen.py)."""\n',
    "_rpc": (
        '"""google.rpc\'s Status and error details as buf generates them (copy_gen.py), for when\n'
        'googleapis-common-protos is not installed: see turnstile_client.rpc."""\n'
    ),
}


def wanted() -> dict[pathlib.Path, str]:
    """The files the copy must hold, by path, with their contents."""
    files: dict[pathlib.Path, str] = {}
    for src, dst in DIRS.items():
        files[PKG / dst / "__init__.py"] = INIT[dst]
        for f in sorted((GEN / src).iterdir()):
            if f.suffix not in (".py", ".pyi"):
                continue
            text = f.read_text()
            text = text.replace("from turnstile.v1 import ", "from turnstile_client.v1 import ")
            # The module the message classes name as theirs (pickle imports it).
            text = text.replace("(DESCRIPTOR, '" + src.replace("/", ".") + ".", "(DESCRIPTOR, 'turnstile_client." + dst + ".")
            files[PKG / dst / f.name] = text
    files[PKG / "_rpc" / "LICENSE"] = RPC_LICENSE.read_text()
    return files


def main(argv: list[str]) -> int:
    check = argv[1:] == ["--check"]
    files = wanted()
    stale = []
    for dst in DIRS.values():
        for f in sorted((PKG / dst).glob("*")):
            if f.is_file() and f not in files:
                stale.append(f)
                if not check:
                    f.unlink()
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            stale.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if check and stale:
        print("the package's copy of gen/python is stale: run python3 clients/python/copy_gen.py and commit", file=sys.stderr)
        for f in stale:
            print("  " + str(f.relative_to(HERE.parents[1])), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
