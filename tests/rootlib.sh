# rootlib.sh: the Debian 12 root the deploy suite boots (sourced).
#
# debian_root: sets $root to a minimal Debian 12 system made once by
# debootstrap from Debian's archive (systemd, sshd, python3 for ansible's
# modules, beed's and trainmonitor's runtime libraries) and kept in
# $BEED_TEST_CACHE (default /var/cache/beed-test): outside the
# repository, reused by every run; the tests boot throwaway copies of it
# (--ephemeral).  Exits 77 (skipped) when it cannot be made (no archive).
# The recipe's version is in the directory's name: bump it with the list.
debian_root() {
  local cache=${BEED_TEST_CACHE:-/var/cache/beed-test} new pkgs
  root=$cache/bookworm-ssh-2
  pkgs=systemd,systemd-sysv,dbus,libuv1,libmsgpackc2,libsodium23
  pkgs+=,libwebsockets17,libwebsockets-evlib-uv,libopenblas0-pthread,libssl3
  pkgs+=,zlib1g,libgfortran5,libstdc++6,libcap2,openssh-server,python3
  pkgs+=,python3-apt
  [ -x "$root/usr/lib/systemd/systemd" ] && return 0
  mkdir -p "$cache"
  new=$(mktemp -d -p "$cache")
  echo "making the Debian 12 root in $root (once; one to three minutes)"
  if ! debootstrap --variant=minbase --include="$pkgs" bookworm "$new" \
    >"$new.log" 2>&1; then
    tail -5 "$new.log"
    rm -rf "$new" "$new.log"
    echo "SKIP: debootstrap failed (no Debian archive here?)"
    exit 77
  fi
  chroot "$new" useradd --system --home /var/lib/beed \
    --shell /usr/sbin/nologin beed
  rm -f "$new.log"
  rm -rf "$root"
  mv "$new" "$root"
}
