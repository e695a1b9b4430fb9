# Sourced by dev/serve and dev/test: a project-local virtual environment
# with the package and the given extras installed from the registry, at the
# versions of dev/pins.txt (what CI last ran; dev/move-pins moves them).
# SERVICE_ENGINE_VENV names another environment folder; under
# SERVICE_ENGINE_UNPINNED=1 (dev/move-pins) the newest releases are
# installed instead, with pyproject.toml's upper bounds lifted.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python_bin="${PYTHON:-$(command -v python3.11 || command -v python3)}"
venv="${SERVICE_ENGINE_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  "$python_bin" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
if [ "${SERVICE_ENGINE_UNPINNED:-0}" = 1 ]; then
  "${pip[@]}" --upgrade pip packaging
  "$venv/bin/python" dev/pins.py unbounded >"$venv/unbounded.txt"
  "${pip[@]}" --upgrade -r "$venv/unbounded.txt"
  "${pip[@]}" --no-deps -e ".[$1]"
else
  # PIP_CONSTRAINT reaches the isolated build environment too (hatchling).
  export PIP_CONSTRAINT="$PWD/dev/pins.txt"
  "${pip[@]}" pip
  "${pip[@]}" -e ".[$1]"
fi
