"""pip install . works from a clean checkout, and its wheel trains the digits example.

    pip_install_test.py SOURCE_ROOT SCRATCH_DIR BUILD_PACKAGE_DIR

1. A clean copy of the checkout (the files git knows: tracked, and untracked ones not ignored;
   no build directory) in SCRATCH_DIR/src.
2. venv A (python3 -m venv --system-site-packages, Debian's numpy and torch visible):
   `pip install .`, the README's command, with pip's default build isolation and no package
   index. `python -m co2` from A names the library inside A's site-packages, A's co2run, and
   the transports the build compiled in, which are those of the meson build (BUILD_PACKAGE_DIR,
   the co2 package of build/bindings/python).
3. `pip wheel --no-deps --no-build-isolation .` (the backend's other path: meson-python found
   without its help) gives one wheel; venv B installs it with --no-index (a wheel install
   builds nothing), and so does the user scheme (pip install --user into a scratch
   PYTHONUSERBASE). The source copy is deleted before B is used, so nothing of the build tree
   can be reached.
4. The digits example, 2 processes under B's co2run (UCX over loopback TCP), trains co2 to the
   accuracy the example documents from the installed wheel alone.
The commands run without PYTHONPATH and LD_LIBRARY_PATH.
"""
import ast
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import sysconfig

ACCURACY_THRESHOLD = 0.95   # examples/python/README.md: co2 reaches 96.4 % (seed 0)
FEATURES = ("UCX", "CUDA", "NCCL")   # co2/_build_info.py


def run(command, cwd, env, what):
    """Runs `command`; its output is printed; a failure names `what`."""
    print(f"$ {' '.join(map(str, command))}   (in {cwd})", flush=True)
    result = subprocess.run([str(c) for c in command], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    print(result.stdout, flush=True)
    if result.returncode != 0:
        sys.exit(f"FAIL: {what}: exit status {result.returncode}")
    return result.stdout


def check(condition, message):
    if not condition:
        sys.exit(f"FAIL: {message}")


def clean_copy(source, destination):
    """The checkout's files that git knows, without build directories."""
    listed = subprocess.run(["git", "-C", source, "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], check=True, stdout=subprocess.PIPE).stdout
    for name in filter(None, listed.decode().split("\0")):
        path = os.path.join(source, name)
        if os.path.isfile(path):     # tracked but deleted in the working tree: left out
            os.makedirs(os.path.dirname(os.path.join(destination, name)), exist_ok=True)
            shutil.copy2(path, os.path.join(destination, name))


def report(python, env, cwd):
    """`python -m co2` as {label: value}."""
    lines = run([python, "-m", "co2"], cwd, env, f"{python} -m co2").splitlines()
    check(lines and lines[0].startswith("co2 "), f"python -m co2 printed no version: {lines}")
    fields = {"version": lines[0].split()[1]}
    for line in lines[1:]:
        label, _, value = line.partition(":")
        fields[label.strip()] = value.strip()
    return fields


def site_packages(venv):
    return sysconfig.get_path("platlib", "venv", vars={"base": venv, "platbase": venv})


def main():
    source, scratch, build_package = sys.argv[1:4]
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "PYTHONUSERBASE", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    version = re.search(r"version:\s*'([^']+)'", open(os.path.join(source, "meson.build")).read())[1]

    src = os.path.join(scratch, "src")
    clean_copy(source, src)
    check(os.path.isfile(os.path.join(src, "pyproject.toml")), "pyproject.toml is not in git")

    # 2. pip install . into a fresh venv, the README's way.
    venv_a = os.path.join(scratch, "venv-a")
    run([sys.executable, "-m", "venv", "--system-site-packages", venv_a], scratch, env, "venv A")
    run([os.path.join(venv_a, "bin", "pip"), "install", "."], src, env, "pip install .")
    python_a = os.path.join(venv_a, "bin", "python")
    installed = report(python_a, env, scratch)
    check(installed["version"] == version,
          f"python -m co2 says {installed['version']}, meson.build says {version}")
    library = os.path.realpath(os.path.join(site_packages(venv_a), "co2", "libco2.so.1"))
    check(installed["library"] == library,
          f"the library loaded is {installed['library']}, not the one inside venv A ({library})")
    check(installed["co2run"] == os.path.realpath(os.path.join(venv_a, "bin", "co2run")),
          f"co2run is {installed['co2run']}, not venv A's bin/co2run")
    # The meson build's record is read, not imported: its libco2 may be sanitized.
    built = runpy.run_path(os.path.join(build_package, "co2", "_build_info.py"))
    built = {name: built[name] for name in FEATURES}
    features = run([python_a, "-c", "from co2 import _build_info as b; "
                    f"print({{n: getattr(b, n) for n in {FEATURES!r}}})"],
                   scratch, env, "co2._build_info from venv A")
    check(ast.literal_eval(features.strip()) == built,
          f"the pip build compiled in {features.strip()}, the meson build {built}")
    check(installed["transports"].split(" (")[0].split(", ") ==
          [name for name, present in (("local", True), ("ucx", built["UCX"]),
                                      ("nccl", built["NCCL"])) if present],
          f"python -m co2 lists the transports {installed['transports']!r}; built: {built}")

    # 3. pip wheel: one wheel, which venv B and the user scheme install without building.
    dist = os.path.join(scratch, "dist")
    run([os.path.join(venv_a, "bin", "pip"), "wheel", "--no-deps", "--no-build-isolation",
         "-w", dist, "."], src, env, "pip wheel --no-deps --no-build-isolation .")
    wheels = os.listdir(dist)
    check(len(wheels) == 1 and wheels[0].startswith(f"co2-{version}-") and
          wheels[0].endswith(".whl"), f"pip wheel gave {wheels}")
    wheel = os.path.join(dist, wheels[0])
    shutil.copy2(os.path.join(src, "examples", "python", "digits.py"), scratch)
    shutil.rmtree(src)

    venv_b = os.path.join(scratch, "venv-b")
    run([sys.executable, "-m", "venv", "--system-site-packages", venv_b], scratch, env, "venv B")
    output = run([os.path.join(venv_b, "bin", "pip"), "install", "--no-index", wheel], scratch,
                 env, "pip install of the wheel into venv B")
    check("Building wheel" not in output, "installing the wheel built something")
    python_b = os.path.join(venv_b, "bin", "python")
    from_wheel = report(python_b, env, scratch)
    check(from_wheel["library"].startswith(site_packages(venv_b) + os.sep),
          f"venv B loads {from_wheel['library']}, not its own")

    user_base = os.path.join(scratch, "user")
    user_env = dict(env, PYTHONUSERBASE=user_base)
    # Debian marks its Python externally managed: --user needs --break-system-packages (it
    # writes under PYTHONUSERBASE only).
    run([sys.executable, "-m", "pip", "install", "--user", "--break-system-packages",
         "--no-index", wheel], scratch, user_env, "pip install --user of the wheel")
    for_user = report(sys.executable, user_env, scratch)
    check(for_user["library"].startswith(os.path.realpath(user_base) + os.sep),
          f"the user install loads {for_user['library']}, not the one under {user_base}")
    check(for_user["co2run"] == os.path.realpath(os.path.join(user_base, "bin", "co2run")),
          f"the user install's co2run is {for_user['co2run']}")

    # 4. The digits example from the wheel: 2 processes under venv B's co2run, over UCX.
    out = os.path.join(scratch, "results")
    train_env = dict(env, UCX_TLS="tcp", UCX_NET_DEVICES="lo", CO2_LOG_LEVEL="warn")
    run([os.path.join(venv_b, "bin", "co2run"), "--nproc-per-node", "2", python_b, "-u",
         "digits.py", "--seeds", "1", "--algorithms", "co2", "--no-ddp", "--out", out],
        scratch, train_env, "the digits example under venv B's co2run")
    runs = json.load(open(os.path.join(out, "digits.json")))["runs"]
    check(len(runs) == 1 and runs[0]["algorithm"] == "co2" and runs[0]["world_size"] == 2,
          f"digits.json holds {[(r['algorithm'], r['world_size']) for r in runs]}")
    check(runs[0]["accuracy"] >= ACCURACY_THRESHOLD,
          f"co2 reached {100 * runs[0]['accuracy']:.2f} % held-out accuracy "
          f"(threshold {100 * ACCURACY_THRESHOLD:.0f} %)")
    print(f"ok: pip install . and its wheel ({wheels[0]}); digits from the wheel: "
          f"{100 * runs[0]['accuracy']:.2f} %")


if __name__ == "__main__":
    main()
