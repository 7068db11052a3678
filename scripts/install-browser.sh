#!/usr/bin/env bash
# Debian's Chromium for the chat-page tests (driven by Playwright with executable_path; Playwright's own
# browser download is never used). Quick when it is already installed.
set -euo pipefail
command -v chromium >/dev/null && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "chromium is missing; install it (apt-get install -y chromium) or the chat-page tests are skipped" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
echo "installed $(chromium --version)"
