#!/usr/bin/env bash
# Developer entry point: `./dev.sh demo` serves the demo agent on 127.0.0.1:8000/acp
# (`ACP_DEMO_OAUTH=1 ./dev.sh demo`: as an OAuth 2 protected resource, demo_project/oauth.py);
# `./dev.sh demo-h2` (or `HTTP2=1 ./dev.sh demo`) serves it over HTTPS with HTTP/2 on
# 127.0.0.1:8443/acp (docs/http2.md); `./dev.sh test` runs the whole test suite. Each installs
# what it needs into .venv first.
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

# daphne's flags for both demos: message size: our 16 MiB body limit also applies to WebSocket messages.
WEBSOCKET_LIMITS=(--websocket-max-message-size 16781312 --websocket-max-frame-size 16781312)

command=${1:-}
if [ "$command" = demo ] && [ "${HTTP2:-}" = 1 ]; then
  command=demo-h2
fi

case "$command" in
  demo-h2)
    ensure_venv demo-h2 ".[redis,http2]"
    shift
    # daphne speaks HTTP/2 only over TLS (chosen through ALPN): a self-signed certificate for
    # localhost/127.0.0.1/::1, made anew at each start under .venv (never committed), trusted
    # only by the clients told to (curl --cacert, HttpClient(verify=...)).
    cert_dir="$VENV/dev-cert"
    "$VENV/bin/python" -m demo_project.devcert "$cert_dir" >/dev/null
    port=${PORT:-8443}
    echo "serving https://${HOST:-127.0.0.1}:$port/acp over HTTP/2 and HTTP/1.1; the certificate: $cert_dir/cert.pem" >&2
    exec "$VENV/bin/daphne" \
      -e "ssl:port=$port:interface=${HOST:-127.0.0.1}:backlog=2048:privateKey=$cert_dir/key.pem:certKey=$cert_dir/cert.pem" \
      "${WEBSOCKET_LIMITS[@]}" "$@" demo_project.asgi:application
    ;;
  demo)
    if [ "${ACP_DEMO_OAUTH:-}" = 1 ]; then
      # OAuth 2 with django-oauth-toolkit (demo_project/oauth.py): migrate, the demo user and a
      # public client, then how to get a token.
      ensure_venv demo-oauth ".[redis,oauth]"
      "$VENV/bin/python" -m demo_project.oauth setup
    else
      ensure_venv demo ".[redis]"
    fi
    shift
    # backlog: daphne's default of 50 drops connections under bursts of clients.
    exec "$VENV/bin/daphne" -e "tcp:port=${PORT:-8000}:interface=${HOST:-127.0.0.1}:backlog=2048" \
      "${WEBSOCKET_LIMITS[@]}" "$@" demo_project.asgi:application
    ;;
  test)
    ensure_venv test ".[test]"
    shift
    # The official TypeScript SDK client, a published third-party ACP agent (a stdio subprocess
    # behind the server) and the TypeScript peer server: each `npm ci` runs when its lock file
    # is newer than its node_modules, the three at once.
    npm_jobs=()
    for dir in tests/interop/js tests/agents tests/peers/ts_server; do
      if [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules" ]; then
        (cd "$dir" && npm ci --silent --no-audit --no-fund && touch node_modules) &
        npm_jobs+=($!)
      fi
    done
    for job in "${npm_jobs[@]}"; do wait "$job"; done
    # tests/test_browser.py drives Debian's chromium (never a downloaded browser): install it
    # here when missing and we may (root with apt-get), so a fresh CI machine needs nothing else.
    if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
    fi
    # In parallel (pytest-xdist): TEST_WORKERS processes (4 by default: most tests wait on
    # servers, so more than the two cores pay), the slow ones first, live tests that share a
    # server grouped (tests/conftest.py; docs/testing.md). `-n 0` runs one test at a time.
    exec "$VENV/bin/python" -m pytest -n "${TEST_WORKERS:-4}" --dist loadgroup --no-loadscope-reorder "$@"
    ;;
  *)
    echo "usage: ./dev.sh demo | ./dev.sh demo-h2 | ./dev.sh test [pytest args]" >&2
    exit 2
    ;;
esac
