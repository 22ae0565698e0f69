#!/usr/bin/env bash
# Installs Debian's `chromium` when it is missing: the picture test (__test__/inspect.test.mjs)
# renders `courier-relay inspect`'s page in it, headless. Does nothing when /usr/bin/chromium is
# there already; needs apt-get (and root) otherwise.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core
