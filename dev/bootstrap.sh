# Sourced by dev/serve and dev/test: a project-local virtual environment
# with the package and the given extras installed from the registry, at the
# versions of dev/pins.txt (what CI last ran; dev/move-pins moves them).
# SERVICE_ENGINE_VENV names another environment folder; under
# SERVICE_ENGINE_UNPINNED=1 (dev/move-pins) the newest releases are
# installed instead, with pyproject.toml's upper bounds lifted. PYTHON names
# the interpreter (python3.11 by default).
#
# uv installs: the interpreter's own pip brings uv (pinned too) into the
# environment once, then uv resolves from its cache in a second or two where
# pip took most of a minute.
set -euo pipefail
# Python keeps each module's compiled bytecode (__pycache__) unless the
# environment turns that off. The battery starts dozens of interpreters
# (pytest workers, pods, twins), and each would compile every module it
# imports anew: a pod's imports cost ~3.6 s of CPU compiled from source
# against ~1.2 s read from the cache.
unset PYTHONDONTWRITEBYTECODE
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python_bin="${PYTHON:-$(command -v python3.11 || command -v python3)}"
venv="${SERVICE_ENGINE_VENV:-.venv}"
pins="$PWD/dev/pins.txt"
unpinned="${SERVICE_ENGINE_UNPINNED:-0}"
if [ ! -x "$venv/bin/python" ]; then
  "$python_bin" -m venv --without-pip "$venv"
fi
if [ ! -x "$venv/bin/uv" ]; then
  uv_pin=(-c "$pins")
  [ "$unpinned" != 1 ] || uv_pin=()
  "$python_bin" -m pip --python "$venv/bin/python" install --quiet \
    --disable-pip-version-check "${uv_pin[@]}" uv
fi
# --quiet also silences the note that a cache on another filesystem (a mounted
# home, a tmpfs) is copied from instead of linked: it still installs.
uv=("$venv/bin/uv" pip install --quiet --python "$venv/bin/python")
if [ "$unpinned" = 1 ]; then
  "${uv[@]}" --upgrade uv packaging
  "$venv/bin/python" dev/pins.py unbounded >"$venv/unbounded.txt"
  "${uv[@]}" --upgrade -r "$venv/unbounded.txt"
  "${uv[@]}" --no-deps -e ".[$1]"
else
  # The pins hold for the isolated build environment too (hatchling).
  "${uv[@]}" --constraints "$pins" --build-constraints "$pins" -e ".[$1]"
fi
