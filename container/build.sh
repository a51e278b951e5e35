#!/bin/sh
# Builds the fenceq container image without pulling anything: the static fenceq binary
# is compiled on this host, then Containerfile copies it, with this host's CA bundle,
# into an image FROM scratch.
#
#   container/build.sh [IMAGE]           # default fenceq:latest, built with podman
#   CONTAINER_ENGINE=docker container/build.sh fenceq:dev
#
# GOARCH (e.g. arm64) picks the image's architecture; CA_BUNDLE another certificate file.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
image=${1:-fenceq:latest}
engine=${CONTAINER_ENGINE:-podman}
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

if [ ! -r "$ca" ]; then
	echo "container/build.sh: no CA bundle at $ca (Debian: apt-get install ca-certificates; or set CA_BUNDLE)" >&2
	exit 1
fi
command -v "$engine" >/dev/null 2>&1 || {
	echo "container/build.sh: $engine not found (Debian: apt-get install podman runc; or set CONTAINER_ENGINE=docker)" >&2
	exit 1
}

# The build context holds only what the image needs.
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT INT TERM

cd "$root"
CGO_ENABLED=0 go build -trimpath -o "$ctx/fenceq" ./cmd/fenceq
cp "$ca" "$ctx/ca-certificates.crt"
cp container/passwd container/group "$ctx/"
mkdir -p "$ctx/dirs/tmp"
chmod 1777 "$ctx/dirs/tmp"
chmod 0644 "$ctx/ca-certificates.crt" "$ctx/passwd" "$ctx/group"

# podman keeps an image per instruction for its layer cache unless told not to; every
# step here is a cheap COPY, and the kept images would pile up with each new binary.
set --
case $(basename "$engine") in
podman | buildah) set -- --layers=false ;;
esac
"$engine" build "$@" --file Containerfile --tag "$image" "$ctx"
