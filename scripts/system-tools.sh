#!/usr/bin/env bash
# The Debian packages the deploy tests run (tests/deploy): prometheus (promtool, prometheus) and haproxy.
# Installed with apt-get when missing and this user may; a machine without them runs the other tests.
set -euo pipefail
missing=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || missing+=(prometheus)
command -v haproxy >/dev/null || missing+=(haproxy)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing ${missing[*]}: install them with apt-get (as root) to run every deploy test" >&2
  exit 1
fi
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
