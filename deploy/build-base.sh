#!/bin/sh
# Make the Containerfile's default base image locally, from Debian's archive, for a machine
# that reaches no image registry: a minbase bookworm root file system made by debootstrap,
# imported into podman as localhost/debian:bookworm-slim (the Containerfile's BASE default).
#
#   deploy/build-base.sh [IMAGE] [SUITE] [MIRROR]
#
# Needs root, debootstrap and podman. Where a registry is reachable, skip this and build
# with --build-arg BASE=docker.io/library/debian:bookworm-slim.
set -eu

image=${1:-localhost/debian:bookworm-slim}
suite=${2:-bookworm}
mirror=${3:-http://deb.debian.org/debian}

for tool in debootstrap podman; do
    command -v "$tool" >/dev/null || { echo "build-base.sh: $tool is not installed (apt-get install -y $tool)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "build-base.sh: debootstrap needs root (run with sudo)" >&2; exit 1; }

root=$(mktemp -d "${TMPDIR:-/var/tmp}/build-base.XXXXXX")
trap 'rm -rf "$root"' EXIT INT TERM

debootstrap --variant=minbase "$suite" "$root" "$mirror"

# What a slim image leaves out: package lists, caches, docs, man pages, logs.
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
       "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/tmp/* "$root"/var/tmp/*
# apt in the image reads the same archive the root file system came from.
echo "deb $mirror $suite main" > "$root/etc/apt/sources.list"

tar --numeric-owner -C "$root" -c . | podman import \
    --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$image"
echo "build-base.sh: made $image from $suite ($mirror)"
