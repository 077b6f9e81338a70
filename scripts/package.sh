#!/bin/bash
# Builds the Debian packages of nvmfd into target/debian/ (docs/OPERATIONS.md):
#   nvmfd_VERSION-1_ARCH.deb  the target, its systemd unit, /etc/nvmfd/nvmfd.json, man page,
#                             shell completions
#   nvmf_VERSION-1_ARCH.deb   the host tools (nvmf), man pages, shell completions
# Steps: a release build of both binaries; their man pages and completion scripts generated
# from the binaries' own command-line definitions (clap) into target/packaging/; then
# cargo-deb (installed into ~/.cargo/bin first when missing) packs each crate's
# [package.metadata.deb]. Nothing it produces is committed.
# usage: scripts/package.sh [--profile dev]
#   --profile dev: package the debug build (target/debug, stripped) instead of a release
#   build; scripts/test.sh does so to check the packages without a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
if [ "${1:-}" = --profile ]; then profile=${2:?--profile needs dev or release}; fi
case "$profile" in
  release) bin=target/release; build=(cargo build --release) ;;
  dev) bin=target/debug; build=(cargo build) ;;
  *) echo "package: --profile dev or release, not $profile" >&2; exit 2 ;;
esac

CARGO_DEB_VERSION=3.8.0
if ! cargo deb --version >/dev/null 2>&1; then
  echo "package: installing cargo-deb $CARGO_DEB_VERSION (cargo install)"
  cargo install --locked --quiet cargo-deb --version "$CARGO_DEB_VERSION"
fi

"${build[@]}" -p nvmfd -p nvmf-host --bins

gen=target/packaging
rm -rf "$gen"
mkdir -p "$gen/man" "$gen/completions"
"$bin/nvmfd" --generate-man "$gen/man"
"$bin/nvmf" generate-man "$gen/man"
gzip -9n "$gen"/man/*.[18]
for tool in nvmfd nvmf; do
  if [ "$tool" = nvmfd ]; then gen_cmd=("$bin/nvmfd" --completions); else gen_cmd=("$bin/nvmf" completions); fi
  "${gen_cmd[@]}" bash > "$gen/completions/$tool.bash"
  "${gen_cmd[@]}" zsh > "$gen/completions/_$tool"
  "${gen_cmd[@]}" fish > "$gen/completions/$tool.fish"
done

cargo deb --no-build --strip --profile "$profile" -p nvmfd
cargo deb --no-build --strip --profile "$profile" -p nvmf-host
ls -l target/debian/*.deb
