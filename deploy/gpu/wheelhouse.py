"""``python -m deploy.gpu.wheelhouse [DIR]``: download the wheels of ``wheelhouse.txt`` for an offline GPU host
(CPython 3.12, manylinux x86_64) into DIR (default ``.whl``). Each package is tried against the manylinux
tags pip matches exactly; one that no tag matches fails the command, naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LIST = Path(__file__).with_name("wheelhouse.txt")
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_35_x86_64"]


def requirements() -> list[str]:
    return [ln.split("#", 1)[0].strip() for ln in LIST.read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]


def built_here() -> set[str]:
    """Requirements marked ``# build``: no wheel on the index (an sdist only), built here into a pure-Python one."""
    return {ln.split("#", 1)[0].strip() for ln in LIST.read_text().splitlines()
            if not ln.startswith("#") and ln.split("#", 1)[-1].strip() == "build" and "#" in ln}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else ".whl")
    out.mkdir(parents=True, exist_ok=True)
    flags = [f"--platform={p}" for p in PLATFORMS]
    failed = []
    build = built_here()
    for req in requirements():
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", *flags, "-d", str(out), req]
        if req in build:
            cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), req]
        if subprocess.run(cmd, check=False).returncode != 0:
            failed.append(req)
    if failed:
        print(f"error: no wheel for {', '.join(failed)} (CPython 3.12, manylinux x86_64)", file=sys.stderr)
        return 1
    print(f"{len(requirements())} wheels in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
