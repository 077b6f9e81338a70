#!/usr/bin/env bash
# scripts/build-fio-engine.sh - build the nvmf fio engine (crates/nvmf-fio) for the fio
# installed here and print the path of the .so (target/nvmf-fio/libnvmf_fio.so).
#
# The engine's C shim must be compiled against the source tree of the very fio that loads it
# (struct layouts), so this fetches Debian's source package of the INSTALLED fio version
# through a private apt configuration (the machine's apt sources and lists stay as they are),
# runs fio's ./configure in it, and builds crates/nvmf-fio in release mode with FIO_SRC set.
# Everything fetched stays under target/nvmf-fio/ (ignored by git; $CARGO_TARGET_DIR/nvmf-fio/
# when that is set); a second run reuses it.
#
# env: FIO_SRC          use this configured fio tree instead of fetching one (its version must
#                       match `fio --version`)
#      FIO              the fio binary (default: fio on PATH)
#      NVMFD_FIO_MIRROR Debian mirror for the source package (default: the machine's own)
# Needs: fio, dpkg-dev (dpkg-source), a C compiler, cargo. Exits non-zero with a message on
# any mismatch or failure.
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
export PATH="$HOME/.cargo/bin:$PATH"
root=$PWD
target=${CARGO_TARGET_DIR:-$root/target}
out=$target/nvmf-fio
fail() { echo "build-fio-engine.sh: $*" >&2; exit 1; }
note() { echo "build-fio-engine.sh: $*" >&2; }

fio=${FIO:-$(command -v fio || true)}
[ -n "$fio" ] && [ -x "$fio" ] || fail "no fio found (install Debian's fio package, or set FIO)"
fio_ver=$("$fio" --version | sed -n 's/^fio-//p')
[ -n "$fio_ver" ] || fail "cannot read the version of $fio ('$("$fio" --version)')"

# the version a source tree declares (FIO-VERSION-GEN's DEF_VER)
tree_version() { sed -n 's/^DEF_VER=fio-//p' "$1/FIO-VERSION-GEN" 2>/dev/null; }

if [ -n "${FIO_SRC:-}" ]; then
  src=$(readlink -f "$FIO_SRC")
  [ -f "$src/ioengines.h" ] || fail "FIO_SRC=$FIO_SRC is not a fio source tree"
else
  # Debian's source package of the installed fio
  pkg=$(dpkg-query -S "$(readlink -f "$fio")" 2>/dev/null | cut -d: -f1 | head -n 1 || true)
  [ -n "$pkg" ] || fail "$fio does not belong to a Debian package; build fio from source and set FIO_SRC to its configured tree"
  debver=$(dpkg-query -W -f='${Version}' "$pkg")
  srcpkg=$(dpkg-query -W -f='${source:Package}' "$pkg")
  upstream=${debver#*:}; upstream=${upstream%-*}
  [ "$upstream" = "$fio_ver" ] ||
    fail "installed package $pkg $debver does not match 'fio --version' ($fio_ver); refusing to build a mismatched engine"
  command -v dpkg-source >/dev/null || fail "dpkg-source missing: apt-get install dpkg-dev"
  src=$out/src/$srcpkg-$upstream
  if [ ! -f "$src/.nvmf-fetched-$debver" ]; then
    apt_dir=$out/apt
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/sources.list.d" \
      "$apt_dir/preferences.d" "$out/src"
    mirror=$(grep -rhoE '(URIs: |deb(-src)? )https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list \
             /etc/apt/sources.list.d/ 2>/dev/null | grep -oE 'https?://[^ ]*' | head -n 1 || true)
    mirror=${NVMFD_FIO_MIRROR:-${mirror:-http://deb.debian.org/debian}}
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    opt=""; [ -f "$keyring" ] && opt="[signed-by=$keyring] "
    {
      echo "deb-src $opt${mirror%/} $codename main"
      echo "deb-src $opt${mirror%/} $codename-updates main"
    } > "$apt_dir/sources.list"
    {
      echo "Dir::State::Lists \"$apt_dir/lists\";"
      echo "Dir::Etc::SourceList \"$apt_dir/sources.list\";"
      echo "Dir::Etc::SourceParts \"$apt_dir/sources.list.d\";"
      echo "Dir::Etc::PreferencesParts \"$apt_dir/preferences.d\";"
      echo "Dir::Cache \"$apt_dir\";"
      echo "Dir::Cache::archives \"$apt_dir/archives\";"
      echo "Dir::Cache::pkgcache \"\";"
      echo "Dir::Cache::srcpkgcache \"\";"
    } > "$apt_dir/apt.conf"
    note "fetching Debian source $srcpkg $debver (private apt config $apt_dir/apt.conf)"
    APT_CONFIG=$apt_dir/apt.conf apt-get -q -o APT::Sandbox::User=root update >&2 ||
      fail "apt-get update of the deb-src lists failed (network to $mirror?)"
    rm -rf "$src"
    (cd "$out/src" && APT_CONFIG=$apt_dir/apt.conf apt-get -q -o APT::Sandbox::User=root \
      source "$srcpkg=$debver" >&2) || fail "apt-get source $srcpkg=$debver failed"
    [ -f "$src/ioengines.h" ] || fail "unpacked source not found at $src"
    touch "$src/.nvmf-fetched-$debver"
  fi
fi

tv=$(tree_version "$src")
[ "$tv" = "$fio_ver" ] || fail "fio source at $src is version '${tv:-unknown}', 'fio --version' says $fio_ver"

if [ ! -f "$src/config-host.h" ]; then
  # Debian's own configure line (debian/rules) minus the GUI and the optional engines,
  # which add engines but no fields to the structures the shim uses.
  note "configuring $src"
  (cd "$src" && ./configure --disable-native --prefix=/usr >"$src/.nvmf-configure.log" 2>&1) ||
    { tail -n 20 "$src/.nvmf-configure.log" >&2; fail "fio ./configure failed"; }
fi

note "building crates/nvmf-fio (release) against $src"
FIO_SRC=$src cargo build --release -p nvmf-fio >&2 || fail "cargo build -p nvmf-fio failed"
so=$target/release/libnvmf_fio.so
nm -D --defined-only "$so" | grep -qw get_ioengine || fail "$so has no get_ioengine (shim not built?)"
mkdir -p "$out"
cp -f "$so" "$out/libnvmf_fio.so.tmp" && mv -f "$out/libnvmf_fio.so.tmp" "$out/libnvmf_fio.so"
echo "$fio_ver" > "$out/fio-version"
echo "$out/libnvmf_fio.so"
