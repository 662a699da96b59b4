#!/usr/bin/env bash
# Make sure a redis-server binary exists (the tests and the demo start their own on a free port).
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server not found; installing it with apt-get" >&2
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: no redis-server and no apt-get; install Redis (>= 6) and put redis-server on PATH" >&2
  exit 1
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
# Debian starts a service on 6379 after install; the project never uses it, leave it be.
command -v redis-server >/dev/null
