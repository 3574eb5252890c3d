#!/usr/bin/env bash
# Fetch Nsight Systems 2022.4 (Debian bookworm non-free) into a local folder, WITHOUT installing it:
# `apt-get install nsight-systems` would pull libcuda1 onto a GPU-less machine (a libcuda.so.1 that
# torch and the shim would then try to use). Nsight Systems is a benchmark peer only: tests and CI
# never need it. Usage: benches/nsys_setup.sh [DEST]   (default: .nsys/) -> prints the nsys path.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$(mkdir -p "${1:-$ROOT/.nsys}" && cd "${1:-$ROOT/.nsys}" && pwd)"
NSYS="$DEST/root/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys"
if [ -x "$NSYS" ] && [ -e "$DEST/root/usr/lib/nsight-systems/host-linux-x64/libssh.so" ]; then
  echo "$NSYS"; exit 0
fi
APT="$DEST/apt"
mkdir -p "$APT/lists/partial" "$DEST/debs" "$DEST/root"
cat > "$APT/nonfree.sources" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
O=(-oDir::Etc::SourceList=/dev/null "-oDir::Etc::SourceParts=$APT" "-oDir::State::Lists=$APT/lists"
   -oAPT::Sandbox::User=root)
apt-get "${O[@]}" update >&2
(cd "$DEST/debs" && apt-get "${O[@]}" download nsight-systems-target nsight-systems libssh-4 >&2)
for d in "$DEST"/debs/*.deb; do dpkg -x "$d" "$DEST/root"; done
# The CLI finds its importer at ../host-linux-x64; the importer wants libssh.so.
ln -sfn "$DEST/root/usr/lib/nsight-systems/host-linux-x64" \
  "$DEST/root/usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64"
ln -sf "$DEST/root/usr/lib/x86_64-linux-gnu/libssh.so.4" "$DEST/root/usr/lib/nsight-systems/host-linux-x64/libssh.so"
"$NSYS" --version >&2
echo "$NSYS"
