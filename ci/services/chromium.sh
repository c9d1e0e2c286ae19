#!/usr/bin/env bash
# Chromium for the web view's browser tests (tests/web): Debian's package, /usr/bin/chromium,
# driven by Playwright from PyPI (the test extras) with executable_path: Playwright's own browser
# download cannot run here. No daemon: each test run starts its own headless browser.
#
# One headless start that renders a page (a data: URL, no network) proves the browser runs as
# root in this container (--no-sandbox; --disable-gpu; no background networking, updates or sync).
#
# Usage: chromium.sh [--packages]
set -euo pipefail

BIN=/usr/bin/chromium
FLAGS=(--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update
  --disable-sync --no-first-run)

if [ "${1:-}" = --packages ]; then
  echo chromium
  exit 0
fi

said="already installed"
if [ ! -x "$BIN" ]; then
  if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
    echo "chromium.sh: $BIN is missing; on Debian as root: apt-get install chromium" >&2
    exit 1
  fi
  echo "installing chromium (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get update -q >/dev/null
  timeout 900 apt-get install -y -q --no-install-recommends chromium >/dev/null
  said="installed"
fi
version=$("$BIN" --version 2>/dev/null | head -1)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
if ! out=$(timeout 60 "$BIN" "${FLAGS[@]}" --user-data-dir="$W" --dump-dom 'data:text/html,<p id=ok>chromium renders</p>' 2>"$W/err"); then
  echo "chromium.sh: $version did not render a page headless; its stderr ends:" >&2
  tail -n 5 "$W/err" >&2
  exit 1
fi
[[ $out == *"chromium renders"* ]] || { echo "chromium.sh: $version rendered nothing" >&2; exit 1; }
echo "chromium: $said ($version at $BIN; renders headless)"
