# scripts/lib/bookworm-root.sh - sourced by scripts/package-test.sh and scripts/service-test.sh:
# a clean Debian 12 (bookworm, debootstrap minbase, cached as a tarball in
# ${NVMFD_PKGTEST_CACHE:-~/.cache/nvmfd-pkgtest}) unpacked into $sys and set up for apt in a
# chroot where no service may start.
#   root_unpack DIR    $sys=DIR/root, fresh from the cached tarball (made first if missing)
#   root_chroot        mount proc/sys/dev, this machine's resolver and apt settings, policy-rc.d
#   root_umount        undo root_chroot's mounts (safe to call again)
#   in_root CMD...     run CMD in the chroot with a clean environment
# The caller defines say().

root_unpack() {
  local cache=${NVMFD_PKGTEST_CACHE:-$HOME/.cache/nvmfd-pkgtest} tmp
  local tarball=$cache/bookworm-minbase.tar
  mkdir -p "$cache"
  if [ ! -s "$tarball" ]; then
    say "debootstrap bookworm (minbase) into the cache"
    tmp=$(mktemp -d)
    debootstrap --variant=minbase bookworm "$tmp" http://deb.debian.org/debian >/dev/null
    tar -C "$tmp" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$tmp"
  fi
  sys=$1/root
  root_umount
  rm -rf "$1"
  mkdir -p "$sys"
  tar -C "$sys" -xf "$tarball"
}

root_umount() {
  local m
  [ -n "${sys:-}" ] || return 0   # before root_unpack: nothing mounted (never the host's /proc)
  for m in proc sys dev/pts dev; do umount -l "$sys/$m" 2>/dev/null || true; done
}

root_chroot() {
  local f
  mount -t proc proc "$sys/proc"
  mount --bind /sys "$sys/sys"
  mount --bind /dev "$sys/dev"
  mount --bind /dev/pts "$sys/dev/pts"
  cp /etc/resolv.conf "$sys/etc/resolv.conf"
  # This machine's apt settings for reaching the mirror, if any.
  for f in /etc/apt/apt.conf.d/99artifact-registry; do
    if [ -e "$f" ]; then cp "$f" "$sys/etc/apt/apt.conf.d/"; fi
  done
  # No service may start inside the chroot.
  printf '#!/bin/sh\nexit 101\n' > "$sys/usr/sbin/policy-rc.d"
  chmod 755 "$sys/usr/sbin/policy-rc.d"
}

in_root() {
  chroot "$sys" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"
}
