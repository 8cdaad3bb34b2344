"""python -m co2: the version, what this build has compiled in, and where its pieces live.

    $ python -m co2
    co2 1.2.0
    library:      /venv/lib/python3.11/site-packages/co2/libco2.so.1
    package:      /venv/lib/python3.11/site-packages/co2
    co2run:       /venv/bin/co2run
    transports:   local, ucx (not built: nccl)
    devices:      host (not built: cuda)
    wire formats: fp32, bf16, int8, fp4 (bf16, int8 and fp4: local and ucx transports)
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import os
import shutil

from . import __version__, capi
from . import _build_info
from .engine import WIRE_FORMATS


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def library_path() -> str | None:
    """The file of the libco2 this process loaded (the dynamic loader's answer, so whatever
    RUNPATH or LD_LIBRARY_PATH chose), or None where the loader cannot say."""
    try:
        # Loaded already by the SWIG module: RTLD_NOLOAD finds it by its soname.
        libco2 = ctypes.CDLL("libco2.so.1", mode=os.RTLD_NOLOAD)
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not dladdr(ctypes.cast(libco2.co2_get_version, ctypes.c_void_p), ctypes.byref(info)):
        return None
    return os.path.realpath(os.fsdecode(info.dli_fname))


def co2run_path() -> str | None:
    """The co2run that pip installed with this package (its RECORD names it), else the one on
    PATH (a meson build: build/launcher/co2run), else None."""
    try:
        files = importlib.metadata.distribution("co2").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == "co2run" and os.path.isfile(file.locate()):
            return os.path.realpath(file.locate())
    found = shutil.which("co2run")
    return os.path.abspath(found) if found else None


def _built(features: list[tuple[str, bool]]) -> str:
    """'a, b (not built: c)' from (name, built) pairs."""
    built = [name for name, present in features if present]
    absent = [name for name, present in features if not present]
    return ", ".join(built) + (f" (not built: {', '.join(absent)})" if absent else "")


def report() -> list[str]:
    """The lines `python -m co2` prints."""
    package = os.path.dirname(os.path.abspath(capi.__file__))
    return [
        f"co2 {__version__}",
        f"library:      {library_path() or 'unknown (the dynamic loader cannot say)'}",
        f"package:      {package}",
        f"co2run:       {co2run_path() or 'not found (not installed with this package, not on PATH)'}",
        "transports:   " + _built([("local", True), ("ucx", _build_info.UCX),
                                   ("nccl", _build_info.NCCL)]),
        "devices:      " + _built([("host", True), ("cuda", _build_info.CUDA)]),
        f"wire formats: {', '.join(WIRE_FORMATS)} (bf16, int8 and fp4: local and ucx transports)",
    ]


if __name__ == "__main__":
    print("\n".join(report()))
