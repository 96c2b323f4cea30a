#!/usr/bin/env bash
# The unit suite (every test that needs no server, less the crash matrix's process kills,
# which make test runs: CI's 30 minutes) on the newest CPython >= 3.11 this machine has: pyenv's versions first (${PYENV_ROOT:-~/.pyenv}/versions/*), else /usr/bin/python3.x
# and /usr/local/bin/python3.x. make venv and make test use python3 (3.11); this catches what
# breaks on a newer one (pyproject.toml's classifiers name 3.11 to 3.13).
#
#   .ci/newest-python.sh            # venv in ~/.cache/botmesh/venv-py3XX (reused), then pytest
#   NEWEST_PYTHON=/path/python .ci/newest-python.sh   # that interpreter instead
#
# The tests that need a server are deselected by marker (kafka, postgres, redis, browser),
# as are the long ones (slow, soak). The servers' addresses point at a closed port
# (127.0.0.1:9), so that tests/conftest.py starts no server for the run, and a test that
# needs one but lacks its marker fails with "connection refused" instead of starting one.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
log() { printf '[newest-python %4ss] %s\n' "$(( $(date +%s) - started ))" "$*"; }

# "major minor micro" of a final-release CPython >= 3.11, nothing otherwise
version_of() {
  "$1" -c 'import sys
v = sys.version_info
if sys.implementation.name == "cpython" and v.releaselevel == "final" and v >= (3, 11):
    print(v.major, v.minor, v.micro)' 2>/dev/null || true
}

pick() {
  local best="" best_key=-1 candidate version key
  shopt -s nullglob
  for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/*/bin/python3 \
                   /usr/local/bin/python3.* /usr/bin/python3.*; do
    [[ -x $candidate && $candidate != *-config ]] || continue
    version=$(version_of "$candidate")
    [[ -n $version ]] || continue
    read -r _ minor micro <<<"$version"
    key=$(( minor * 1000 + micro ))
    if (( key > best_key )); then best=$candidate; best_key=$key; fi
  done
  [[ -n $best ]] || { echo "no CPython >= 3.11 found" >&2; exit 1; }
  echo "$best"
}

python=${NEWEST_PYTHON:-$(pick)}
tag=$("$python" -c 'import sys; print("py%d%d" % sys.version_info[:2])')
venv=${NEWEST_PYTHON_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/botmesh/venv-$tag}
log "$("$python" --version) at $python; venv $venv"

[[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --upgrade pip
"$venv/bin/pip" install -q --disable-pip-version-check -e '.[dev]'
log "installed: botmesh $("$venv/bin/python" -c 'import botmesh; print(botmesh.__version__)')"

export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9
export BOTMESH_TEST_POSTGRES_URL=postgresql://unused@127.0.0.1:9/unused
export BOTMESH_TEST_REDIS_URL=redis://127.0.0.1:9/0
export BOTMESH_TEST_REDIS_CLUSTER_URL=redis://127.0.0.1:9/0
log "the unit suite"
"$venv/bin/python" -m pytest -p no:cacheprovider \
  -m "not kafka and not postgres and not redis and not browser and not slow and not soak and not crash" \
  -n "${TEST_WORKERS:-4}" --dist loadgroup "$@"
log "done"
