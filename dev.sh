#!/usr/bin/env bash
# Developer entry point: `./dev.sh demo` serves the demo agent on 127.0.0.1:8000/acp;
# `./dev.sh test` runs the whole test suite. Each installs what it needs into .venv first.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=.venv

# ensure_venv NAME SPEC: install SPEC (e.g. ".[test]") into .venv unless already done.
ensure_venv() {
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  local stamp="$VENV/.installed-$1"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e "$2"
    touch "$stamp"
  fi
}

case "${1:-}" in
  demo)
    ensure_venv demo ".[redis]"
    shift
    # backlog: daphne's default of 50 drops connections under bursts of clients;
    # message size: our 16 MiB body limit also applies to WebSocket messages.
    exec "$VENV/bin/daphne" -e "tcp:port=${PORT:-8000}:interface=${HOST:-127.0.0.1}:backlog=2048" \
      --websocket-max-message-size 16781312 --websocket-max-frame-size 16781312 "$@" demo_project.asgi:application
    ;;
  test)
    ensure_venv test ".[test]"
    shift
    if [ ! -d tests/interop/js/node_modules ] || [ tests/interop/js/package-lock.json -nt tests/interop/js/node_modules ]; then
      (cd tests/interop/js && npm ci --silent --no-audit --no-fund)
    fi
    # a published third-party ACP agent, run as a stdio subprocess behind the server
    if [ ! -d tests/agents/node_modules ] || [ tests/agents/package-lock.json -nt tests/agents/node_modules ]; then
      (cd tests/agents && npm ci --silent --no-audit --no-fund)
    fi
    if [ ! -d tests/peers/ts_server/node_modules ] || [ tests/peers/ts_server/package-lock.json -nt tests/peers/ts_server/node_modules ]; then
      (cd tests/peers/ts_server && npm ci --silent --no-audit --no-fund)
    fi
    # tests/test_browser.py drives Debian's chromium (never a downloaded browser): install it
    # here when missing and we may (root with apt-get), so a fresh CI machine needs nothing else.
    if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
    fi
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
  *)
    echo "usage: ./dev.sh demo | ./dev.sh test [pytest args]" >&2
    exit 2
    ;;
esac
