"""python -m co2 (co2/__main__.py) on the meson build: the version, the libco2 this process
loaded, co2run, and the transports and devices the build compiled in (co2/_build_info.py).
The same command from a pip-installed package: python_pip_install (pip_install_test.py)."""
import os
import subprocess
import sys

import co2
from co2 import _build_info


def python_m_co2(env):
    result = subprocess.run([sys.executable, "-m", "co2"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
    lines = result.stdout.splitlines()
    fields = {"title": lines[0]}
    for line in lines[1:]:
        label, _, value = line.partition(":")
        fields[label.strip()] = value.strip()
    return fields


def test_it_names_the_version_the_loaded_library_and_the_features_built_in():
    co2run = os.environ["CO2RUN"]
    env = dict(os.environ, PATH=os.path.dirname(co2run) + os.pathsep + os.environ["PATH"])
    fields = python_m_co2(env)
    assert fields["title"] == f"co2 {co2.__version__}"
    assert os.path.samefile(fields["library"],
                            os.path.join(os.environ["CO2_BUILD_ROOT"], "libco2.so.1"))
    assert os.path.samefile(fields["package"], os.path.dirname(co2.__file__))
    assert os.path.samefile(fields["co2run"], co2run)
    transports = ["local"] + ["ucx"] * _build_info.UCX + ["nccl"] * _build_info.NCCL
    assert fields["transports"].split(" (")[0] == ", ".join(transports)
    assert fields["devices"].split(" (")[0] == ", ".join(["host"] + ["cuda"] * _build_info.CUDA)
    assert fields["wire formats"].startswith("fp32, bf16, int8")


def test_a_library_loaded_from_elsewhere_is_named_as_loaded():
    """LD_LIBRARY_PATH goes before the module's RUNPATH: the report follows the loader."""
    elsewhere = os.path.join(os.environ["CO2_BUILD_ROOT"], "test-main-libdir")
    os.makedirs(elsewhere, exist_ok=True)
    copy = os.path.join(elsewhere, "libco2.so.1")
    with open(os.path.join(os.environ["CO2_BUILD_ROOT"], "libco2.so.1"), "rb") as source, \
            open(copy, "wb") as target:
        target.write(source.read())
    env = dict(os.environ, LD_LIBRARY_PATH=elsewhere)
    assert os.path.realpath(python_m_co2(env)["library"]) == os.path.realpath(copy)
