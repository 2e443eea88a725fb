#!/usr/bin/env bash
# Installs the system packages Stratalog's set-up needs, only when they are missing.
# Usage: scripts/install-system-deps.sh [extra-command:package ...]
set -euo pipefail

# command -> Debian package
declare -A wanted=(
  [kcat]=kcat
  [etcd]=etcd-server
  [java]=openjdk-17-jre-headless
  # Compiles the benchmark's Java producer (src/stratalog/bench/java/LoadProducer.java).
  [javac]=openjdk-17-jdk-headless
  [mvn]=maven
  # The benchmark's peers and disk probe (stratalog bench; tests/test_bench_peers.py).
  [nats-server]=nats-server
  [redis-server]=redis-server
  [redis-benchmark]=redis-tools
  [fio]=fio
  # Compiles the native column decoder (src/stratalog/client/_columns.c) at install.
  [gcc]=gcc
  # libfuse 3 and fusermount3, for the crash oracle's recording file system
  # (src/stratalog/faults/crash_oracle/, tests/test_crash_oracle.py).
  [fusermount3]=fuse3
  # The web console's browser test (tests/test_console_browser.py): headless Chromium and its
  # WebDriver.
  [chromium]=chromium
  [chromedriver]=chromium-driver
)
for extra in "$@"; do wanted[${extra%%:*}]=${extra#*:}; done

missing=()
for cmd in "${!wanted[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${wanted[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing missing system packages: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "error: need root or sudo to apt-get install: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for cmd in "${!wanted[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || { echo "error: '$cmd' still missing after apt-get" >&2; exit 1; }
done
