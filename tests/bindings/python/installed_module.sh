#!/usr/bin/env bash
# The installed Python module finds the installed libco2 by itself (no LD_LIBRARY_PATH): meson
# install (runtime + python-runtime tags) into a scratch DESTDIR, then the extension module's
# RUNPATH must be the install libdir, where libco2.so.1 landed, and the package must be
# complete (capi.py, the SWIG module's Python half, is installed with it).
#   installed_module.sh BUILD_ROOT
set -euo pipefail
build=$1
command -v readelf >/dev/null || { echo "readelf (binutils) is missing"; exit 77; }
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
meson install -C "$build" --no-rebuild --quiet --tags runtime,python-runtime --destdir "$dest" >/dev/null
module=$(find "$dest" -name '_capi*.so' | head -n 1)
[ -n "$module" ] || { echo "FAIL: no _capi module installed under $dest"; exit 1; }
package=$(dirname "$module")
for f in __init__.py capi.py torch.py; do
  [ -f "$package/$f" ] || { echo "FAIL: $f is not installed next to $module"; exit 1; }
done
runpath=$(readelf -d "$module" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p; s/.*(RPATH).*\[\(.*\)\]/\1/p')
[ -n "$runpath" ] || { echo "FAIL: $module has no RUNPATH: an installed co2 needs LD_LIBRARY_PATH"; exit 1; }
case $runpath in
  *"$build"*) echo "FAIL: RUNPATH $runpath points into the build directory"; exit 1 ;;
esac
found=0
IFS=: read -r -a entries <<< "$runpath"
for entry in "${entries[@]}"; do
  [ -e "$dest$entry/libco2.so.1" ] && found=1
done
[ "$found" = 1 ] || { echo "FAIL: RUNPATH $runpath does not hold the installed libco2.so.1"; exit 1; }
echo "ok: $module has RUNPATH $runpath, where libco2.so.1 is installed"
