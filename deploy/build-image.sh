#!/bin/sh
# Build the mcp-sandbox-repl image with podman from a host-built release binary.
#
#   deploy/build-image.sh [IMAGE] [BASE]
#
# Environment: EXTRA_CA_CERTS (PEM files to trust, see below), PODMAN_RUNTIME (runc).
# IMAGE defaults to localhost/mcp-sandbox-repl:<version>; BASE to the Containerfile's
# (localhost/debian:bookworm-slim, made by deploy/build-base.sh). The build context is a
# temporary directory holding only the binary, so nothing else of the checkout (target/,
# tokens, state) reaches the image.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
# Artifacts live under target/<host triple>/ (see .cargo/config.toml).
bin="$repo/target/$(rustc -vV | sed -n 's/^host: //p')/release/mcp-sandbox-repl"

if [ ! -x "$bin" ]; then
    echo "build-image.sh: building $bin (cargo build --release --locked)" >&2
    (cd "$repo" && cargo build --release --locked)
fi
version=$("$bin" --version | awk '{print $2}')
image=${1:-localhost/mcp-sandbox-repl:$version}
base=${2:-}

ctx=$(mktemp -d "${TMPDIR:-/var/tmp}/build-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT INT TERM
cp "$bin" "$ctx/mcp-sandbox-repl"
# EXTRA_CA_CERTS: space-separated PEM files the build (pip, for uv) and the image trust
# besides Debian's, e.g. an intercepting proxy's CA.
mkdir "$ctx/ca"
for cert in ${EXTRA_CA_CERTS:-}; do cp "$cert" "$ctx/ca/$(basename "$cert" .crt).crt"; done

set -- --file "$here/Containerfile" --tag "$image" --network host
if [ -n "$base" ]; then set -- "$@" --build-arg "BASE=$base"; fi
# runc: crun refuses hosts with hybrid cgroups (v1 controllers beside a v2 mount).
podman --runtime "${PODMAN_RUNTIME:-runc}" build "$@" "$ctx"
echo "build-image.sh: built $image" >&2
