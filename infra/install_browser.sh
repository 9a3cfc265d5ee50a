#!/usr/bin/env bash
# Debian's Chromium and its WebDriver, for the console's browser tests (tests/e2e/test_console_browser.py).
# Installed with apt-get (as root, or through sudo), never downloaded by a test tool: the tests
# drive /usr/bin/chromium through /usr/bin/chromedriver and fail loudly when either is missing.
set -euo pipefail
SERVICE=browser
source "$(dirname "$0")/lib.sh"

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  say "chromium and chromedriver are installed"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || die "not root and no sudo: install chromium and chromium-driver with apt-get by hand"
  exec sudo -n bash "$0" "$@"
fi
began=$SECONDS
apt_install chromium chromium-driver
[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || die "apt-get installed no /usr/bin/chromium or /usr/bin/chromedriver"
say "installed $(/usr/bin/chromedriver --version | cut -d' ' -f1-2) in $(elapsed "$began")"
