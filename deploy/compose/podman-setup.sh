#!/usr/bin/env bash
# Podman on a machine without Docker (recipe of /work/shared/reference/containers.md), idempotent:
# podman + runc + debootstrap, the ulimit fix, and a local Debian bookworm base image `localdebian`
# (Python 3.11, like the CPU torch wheel). Needs root. Prints the podman command line to use.
set -euo pipefail
if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null || ! command -v runc >/dev/null; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc debootstrap >&2
fi
conf=/etc/containers/containers.conf
if ! grep -q 'default_ulimits' "$conf" 2>/dev/null; then
  mkdir -p /etc/containers && printf '[containers]\ndefault_ulimits = []\n' >> "$conf"
fi
P="podman --cgroup-manager=cgroupfs --runtime runc"
if ! $P image exists localhost/localdebian; then
  rootfs=$(mktemp -d)/rootfs
  mirror=$(grep -h '^URIs' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1 | awk '{print $2}')
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >&2
  tar -C "$rootfs" -c . | $P import - localdebian >&2
  rm -rf "$(dirname "$rootfs")"
fi
echo "$P"
