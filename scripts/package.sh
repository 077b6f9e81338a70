#!/bin/bash
# Builds the Debian packages of nvmfd into target/debian/ (docs/OPERATIONS.md):
#   nvmfd_VERSION-1_ARCH.deb  the target, its systemd unit, /etc/nvmfd/nvmfd.json, man page,
#                             shell completions
#   nvmf_VERSION-1_ARCH.deb   the host tools (nvmf), man pages, shell completions
# Steps: a release build of both binaries; their man pages and completion scripts generated
# from the binaries' own command-line definitions (clap) into target/packaging/; then
# cargo-deb (installed into ~/.cargo/bin first when missing) packs each crate's
# [package.metadata.deb]. Nothing it produces is committed.
# usage: scripts/package.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0
if ! cargo deb --version >/dev/null 2>&1; then
  echo "package: installing cargo-deb $CARGO_DEB_VERSION (cargo install)"
  cargo install --locked --quiet cargo-deb --version "$CARGO_DEB_VERSION"
fi

cargo build --release -p nvmfd -p nvmf-host --bins

gen=target/packaging
rm -rf "$gen"
mkdir -p "$gen/man" "$gen/completions"
target/release/nvmfd --generate-man "$gen/man"
target/release/nvmf generate-man "$gen/man"
gzip -9n "$gen"/man/*.[18]
for tool in nvmfd nvmf; do
  if [ "$tool" = nvmfd ]; then gen_cmd=(target/release/nvmfd --completions); else gen_cmd=(target/release/nvmf completions); fi
  "${gen_cmd[@]}" bash > "$gen/completions/$tool.bash"
  "${gen_cmd[@]}" zsh > "$gen/completions/_$tool"
  "${gen_cmd[@]}" fish > "$gen/completions/$tool.fish"
done

cargo deb --no-build --strip -p nvmfd
cargo deb --no-build --strip -p nvmf-host
ls -l target/debian/*.deb
