"""The PEP 517 backend of co2's pyproject.toml: meson-python, found where the system installed it.

pip builds in an isolated environment: a fresh prefix that it fills from a package index with the
build requirements, and a sitecustomize that hides the system's site-packages from every Python
it starts. co2's build requirements are system packages (Debian's python3-mesonpy and
python3-numpy; meson itself is a Python program of the system), and the machines it is built on
often reach no index. So pyproject.toml requires nothing and each hook below first looks for
meson-python and numpy: where pip's environment has them (an index filled it, or
--no-build-isolation) nothing changes; else, where the system's site-packages have them, they
are made visible again, to this process and to the meson it starts (which runs Python to find
numpy's headers); else the hooks ask pip for them from the index, as a plain `requires` would.
"""
import importlib
import importlib.util
import os
import site
import sys

# module -> requirement: what the build imports.
_REQUIREMENTS = {"mesonpy": "meson-python >= 0.12", "numpy": "numpy"}


def _missing():
    return [requirement for module, requirement in _REQUIREMENTS.items()
            if importlib.util.find_spec(module) is None]


def _system_site_packages():
    """The base interpreter's site-packages (Debian: /usr/lib/python3/dist-packages, ...)."""
    return [d for d in site.getsitepackages([sys.base_prefix]) if os.path.isdir(d)]


def _requirements_found():
    """True when the build requirements are importable here, after showing the system's
    site-packages again if pip's isolation hid them and they hold the requirements."""
    if not _missing():
        return True
    hidden = [d for d in _system_site_packages() if d not in sys.path]
    sys.path.extend(hidden)
    importlib.invalidate_caches()
    if _missing():
        del sys.path[len(sys.path) - len(hidden):]
        return False
    # meson and the Pythons it runs: without pip's sitecustomize (the directory of
    # PYTHONPATH holding it), with the system's site-packages.
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and not os.path.isfile(os.path.join(p, "sitecustomize.py"))]
    os.environ["PYTHONPATH"] = os.pathsep.join(kept + hidden)
    return True


def _meson_python():
    if not _requirements_found():
        raise RuntimeError(
            "co2 builds with meson-python and numpy, found neither in pip's build environment "
            "nor in the system's site-packages: install them (Debian: apt install "
            "python3-mesonpy python3-numpy) or let pip reach a package index")
    return importlib.import_module("mesonpy")


def get_requires_for_build_wheel(config_settings=None):
    if not _requirements_found():
        return _missing()
    return _meson_python().get_requires_for_build_wheel(config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _meson_python().build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_sdist(config_settings=None):
    if not _requirements_found():
        return _missing()
    return _meson_python().get_requires_for_build_sdist(config_settings)


def build_sdist(sdist_directory, config_settings=None):
    return _meson_python().build_sdist(sdist_directory, config_settings)
