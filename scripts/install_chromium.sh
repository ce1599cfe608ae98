#!/usr/bin/env bash
# Installs Debian's Chromium and its WebDriver (packages chromium, chromium-driver) for the dashboard's browser
# tests (tests/dashboard, driven with Selenium) and scripts/dashboard_screenshots.py. Idempotent.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
bash "$(dirname "$0")/apt_install.sh" chromium chromium-driver
command -v chromium >/dev/null && command -v chromedriver >/dev/null \
    || { echo "chromium or chromedriver is still missing after the install" >&2; exit 1; }
echo "Chromium and chromedriver installed"
