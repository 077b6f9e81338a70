#!/bin/bash
# Checks the Debian packages that scripts/package.sh builds, on a clean Debian 12 (bookworm)
# made with debootstrap (minbase, cached in ~/.cache/nvmfd-pkgtest), entered with chroot:
#   1. lintian on both packages (the tags left are listed in packaging/lintian-allowed);
#   2. apt installs both into the clean system (their dependencies come from Debian);
#      the packaged nvmfd starts with the packaged unit's command line and answers RPC;
#   3. an upgrade to a second build of the same version (revision 2) keeps the configuration
#      file and the state file;
#   4. purge of both leaves the system as it was before the install (every file outside
#      apt's and dpkg's own bookkeeping compared).
# Needs root, debootstrap, lintian and network access to Debian's mirror (apt).
# scripts/test.sh runs it with --profile dev; without, it checks the release packages.
# usage: scripts/package-test.sh [--no-build] [--profile dev]
#   --profile dev: the packages of the debug build (scripts/package.sh --profile dev), as
#   scripts/test.sh runs it
set -euo pipefail
cd "$(dirname "$0")/.."
root_dir=$(pwd)

say() { echo "package-test: $*"; }
fail() { echo "package-test: FAIL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (debootstrap, chroot)"
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v lintian >/dev/null || need+=(lintian)
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

build=1
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0; shift ;;
    --profile) profile=${2:?--profile needs dev or release}; shift 2 ;;
    *) fail "unknown argument $1 (usage: scripts/package-test.sh [--no-build] [--profile dev])" ;;
  esac
done
if [ "$build" = 1 ]; then
  scripts/package.sh --profile "$profile"
fi
deb_d=$(ls target/debian/nvmfd_*_amd64.deb | sort | tail -1)
deb_h=$(ls target/debian/nvmf_*_amd64.deb | sort | tail -1)

say "lintian"
allowed=packaging/lintian-allowed
lint=$(lintian --tag-display-limit 0 "$deb_d" "$deb_h" 2>&1 || true)
left=$(printf '%s\n' "$lint" | grep -E '^[EW]: ' | awk '{ print $3 }' | sort -u |
       grep -vxF -f <(grep -v '^#' "$allowed" | awk 'NF { print $1 }') || true)
printf '%s\n' "$lint" | sed 's/^/  | /'
[ -z "$left" ] || fail "lintian tags not justified in $allowed: $(echo $left)"

. scripts/lib/bookworm-root.sh
work=$root_dir/target/pkgtest
trap 'root_umount' EXIT
root_unpack "$work"
root_chroot

# Everything but the bookkeeping of apt and dpkg, logs, and what this script put there.
snapshot() {
  (cd "$sys" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./tmp \
     -o -path ./var/lib/dpkg -o -path ./var/lib/apt -o -path ./var/cache -o -path ./var/log \
     -o -path ./run -o -path ./pkgs \) -prune -o -print | sort |
     # the shadow tools' backups, written when a dependency adds a system group
     grep -vxE '\./etc/(passwd|group|shadow|gshadow)-')
}
in_root apt-get update -qq >/dev/null
snapshot > "$work/before.txt"

mkdir -p "$sys/pkgs"
cp "$deb_d" "$deb_h" "$sys/pkgs/"
# The revision-2 builds below replace cargo-deb's output; the ones under test stay here.
cp "$deb_d" "$deb_h" "$work/"
say "install $(basename "$deb_d") $(basename "$deb_h")"
in_root apt-get install -y -qq "/pkgs/$(basename "$deb_d")" "/pkgs/$(basename "$deb_h")" >/dev/null
for f in /usr/sbin/nvmfd /usr/bin/nvmf /etc/nvmfd/nvmfd.json /etc/default/nvmfd \
         /lib/systemd/system/nvmfd.service /usr/share/man/man8/nvmfd.8.gz \
         /usr/share/man/man1/nvmf.1.gz /usr/share/bash-completion/completions/nvmf \
         /usr/share/doc/nvmfd/copyright /usr/share/doc/nvmfd/changelog.Debian.gz \
         /usr/share/nvmfd/monitoring/nvmfd-alerts.yml /usr/share/nvmfd/monitoring/nvmfd-dashboard.json; do
  [ -e "$sys$f" ] || fail "$f not installed"
done
[ -L "$sys/etc/systemd/system/multi-user.target.wants/nvmfd.service" ] ||
  fail "nvmfd.service not enabled"
say "installed; the unit is enabled"

# The unit's command line, inside the clean system.
exec_start=$(sed -n 's/^ExecStart=//p' "$sys/lib/systemd/system/nvmfd.service" | sed 's/ \$NVMFD_OPTS//')
mkdir -p "$sys/var/lib/nvmfd" "$sys/run/nvmfd"
in_root sh -c "$exec_start -m 0 > /var/log/nvmfd-test.log 2>&1 & echo \$! > /run/nvmfd/test.pid"
ok=0
for _ in $(seq 100); do
  if in_root nvmf rpc -s /run/nvmfd/nvmfd.sock spdk_get_version >/dev/null 2>&1; then ok=1; break; fi
  sleep 0.1
done
[ "$ok" = 1 ] || { cat "$sys/var/log/nvmfd-test.log"; fail "the packaged nvmfd does not answer RPC"; }
in_root nvmf rpc -s /run/nvmfd/nvmfd.sock bdev_malloc_create -b PkgTest 8 512 >/dev/null
grep -q PkgTest "$sys/var/lib/nvmfd/state.json" || fail "the state file did not get the change"
kill "$(cat "$sys/run/nvmfd/test.pid")"
sleep 1
say "the packaged nvmfd served RPC and kept the change in /var/lib/nvmfd/state.json"

# Upgrade: revision 2 of the same build; the configuration file edited by the admin stays.
echo '{"subsystems": []}' > "$sys/etc/nvmfd/nvmfd.json.admin"
cp "$sys/etc/nvmfd/nvmfd.json.admin" "$sys/etc/nvmfd/nvmfd.json"
(cd crates/nvmfd && cargo deb --no-build --strip --profile "$profile" --deb-revision 2 -o "$sys/pkgs/" >/dev/null)
(cd crates/nvmf-host && cargo deb --no-build --strip --profile "$profile" --deb-revision 2 -o "$sys/pkgs/" >/dev/null)
say "upgrade to revision 2"
in_root sh -c 'apt-get install -y -qq -o Dpkg::Options::=--force-confold /pkgs/nvmfd_*-2_amd64.deb /pkgs/nvmf_*-2_amd64.deb' >/dev/null
cmp -s "$sys/etc/nvmfd/nvmfd.json" "$sys/etc/nvmfd/nvmfd.json.admin" || fail "the upgrade replaced the edited configuration"
grep -q PkgTest "$sys/var/lib/nvmfd/state.json" || fail "the upgrade lost the state file"
rm "$sys/etc/nvmfd/nvmfd.json.admin"
say "upgraded: configuration and state kept"

say "purge"
in_root apt-get purge -y -qq nvmfd nvmf >/dev/null
# What apt installed for them (librbd1's and librados2's own dependencies) goes the same way.
in_root apt-get autoremove --purge -y -qq >/dev/null
rm -f "$sys/var/log/nvmfd-test.log"
snapshot > "$work/after.txt"
if ! diff -u "$work/before.txt" "$work/after.txt" > "$work/left.diff"; then
  cat "$work/left.diff"
  fail "purge left the system different from before the install (above)"
fi
say "purged: nothing left behind"
say "PASS"
