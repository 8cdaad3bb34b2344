"""The co2 package's types, checked with Debian's mypy the way a user's checker sees them: the
package as built (py.typed, capi.pyi beside the generated capi.py) on the import path, the
settings of the repository's mypy.ini.

- the examples type-check with zero errors;
- typing_usage.py: correct uses pass, and each misuse is reported with the expected error code
  (proves the types are seen at all: without py.typed every one of them would pass);
- the package's own sources type-check with every function annotated;
- capi.pyi agrees with the module SWIG generates (mypy's stubtest: every name, every parameter);
- the TypedDicts agree with the runtime tables they describe.
"""
import os
import re
import subprocess
import sys

import pytest

import co2
from co2 import capi, engine

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
CONFIG = os.path.join(SOURCE_ROOT, "mypy.ini")
# The built package (build/bindings/python), not the sources: what an installed co2 ships.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(co2.__file__)))
# One cache for every run of this file: torch's and numpy's stubs are analysed once.
CACHE = os.path.join(os.environ.get("CO2_BUILD_ROOT", PACKAGE_PARENT), "mypy-cache")
# Each directory of examples is checked apart: their scripts import siblings by plain name
# (lm/train.py: `import corpus`), and contrast/ and hierarchical/ both have a train.py.
EXAMPLE_GROUPS = [["digits.py", "plot.py"], ["contrast"], ["hierarchical"], ["lm"]]
# Generous: a cold cache on a loaded 2-core machine analyses torch's stubs for minutes.
MYPY_TIMEOUT_S = 900


def _mypy(*arguments, cwd=SOURCE_ROOT, module="mypy", pythonpath=PACKAGE_PARENT):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    command = [sys.executable, "-m", module, *arguments]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=MYPY_TIMEOUT_S)
    return done.returncode, done.stdout + done.stderr


def _check(*arguments, **kwargs):
    return _mypy("--config-file", CONFIG, "--cache-dir", CACHE, "--python-executable",
                 sys.executable, "--show-error-codes", "--no-error-summary", *arguments,
                 **kwargs)


@pytest.mark.parametrize("group", EXAMPLE_GROUPS, ids=lambda group: group[0])
def test_examples_type_check_with_zero_errors(group):
    paths = [os.path.join("examples", "python", item) for item in group]
    status, output = _check(*paths)
    assert status == 0 and not output.strip(), output


def _reported(output, path):
    """{(line, code)} of mypy's errors in `path`."""
    pattern = re.compile(re.escape(path) + r":(\d+): error: .*\[([a-z-]+)\]$")
    return {(int(m.group(1)), m.group(2)) for m in map(pattern.match, output.splitlines()) if m}


def test_misuse_is_reported_and_correct_use_is_not():
    path = os.path.join("tests", "bindings", "python", "typing_usage.py")
    with open(os.path.join(SOURCE_ROOT, path)) as source:
        expected = {(number, match.group(1)) for number, line in enumerate(source, 1)
                    for match in [re.search(r"# error: \[([a-z-]+)\]$", line)] if match}
    assert len(expected) >= 20
    status, output = _check(path)
    reported = _reported(output, path)
    assert reported == expected, (
        f"missed: {sorted(expected - reported)}; unexpected: {sorted(reported - expected)}\n"
        f"{output}")
    # Only errors in the checked file: none inside co2 or from mypy itself.
    assert all(line.startswith(path) or ": note: " in line
               for line in output.splitlines()), output


def test_package_sources_type_check_fully_annotated():
    # The sources (bindings/python/co2: capi.pyi stands in for the generated capi.py), with
    # mypy.ini's [mypy-co2.*]: every function annotated.
    status, output = _check("-p", "co2", cwd=os.path.join(SOURCE_ROOT, "bindings", "python"),
                            pythonpath="")
    assert status == 0 and not output.strip(), output


def test_capi_stub_matches_the_generated_module(tmp_path):
    # stubtest keeps no cache: torch (which co2's modules name for their annotations) is left
    # unread, as nothing in capi.pyi refers to it.
    config = tmp_path / "stubtest.ini"
    config.write_text("[mypy]\nenable_incomplete_feature = Unpack\n"
                      "[mypy-torch.*]\nfollow_imports = skip\n")
    allowlist = os.path.join(HERE, "typing_stubtest_allowlist.txt")
    status, output = _mypy("co2.capi", "--mypy-config-file", str(config), "--allowlist",
                           allowlist, module="mypy.stubtest", cwd=PACKAGE_PARENT)
    assert status == 0, output


def test_engine_options_and_stats_match_the_runtime_tables():
    # Engine's keywords: EngineOptions plus `algorithm`, each checked by engine._CONFIG_KEYS.
    assert set(co2.EngineOptions.__annotations__) | {"algorithm"} == set(engine._CONFIG_KEYS)
    # Engine.stats(): every field of co2_engine_stats_t but the struct's own bookkeeping.
    c_fields = {name for name in vars(capi.engine_stats) if not name.startswith("_")
                and isinstance(getattr(capi.engine_stats, name), property)}
    bookkeeping = {"thisown", "size", "version"} | {n for n in c_fields if n.startswith("reserved")}
    assert set(co2.EngineStats.__annotations__) == c_fields - bookkeeping
