#!/usr/bin/env bash
# Prints the path of a headless-capable Chromium for the browser tests, installing Debian's
# `chromium` package when none is there (as root, quietly, logging to .venv/apt.log). Playwright
# drives it through that executable path; it never downloads a browser of its own.
# Exit status 1 (and a message on stderr) when no Chromium is found and none can be installed.
set -euo pipefail
cd "$(dirname "$0")/.."
find_chromium() {
  for name in chromium chromium-browser google-chrome-stable google-chrome; do
    if command -v "$name" >/dev/null 2>&1; then
      command -v "$name"
      return 0
    fi
  done
  return 1
}
if find_chromium; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "phaselens: installing Debian's chromium for the browser tests ..." >&2
  mkdir -p .venv
  if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      chromium fonts-dejavu-core; } >>.venv/apt.log 2>&1 && find_chromium; then
    exit 0
  fi
  echo "phaselens: chromium not installed (see .venv/apt.log)" >&2
  exit 1
fi
echo "phaselens: no chromium found and apt-get is not usable here (needs root); install Debian's chromium" >&2
exit 1
