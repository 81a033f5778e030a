#!/usr/bin/env bash
# uml.sh: runs a command under a Linux kernel that has kernel TLS with key
# updates (Linux 6.14 or later, the tls module), for the remote record
# layer's kernel path, on a machine whose own kernel may lack it. The
# kernel is Debian unstable's User-Mode Linux: a kernel that runs as a
# process of this machine, with this machine's root file system (hostfs)
# as its own, so the command sees the same files.
#
#   uml.sh run CMD...   boot it, load the tls module, bring up loopback,
#                       run CMD in the current directory with PATH and the
#                       GPUWARDEN_* variables, power off; exits with CMD's
#                       status (1 when the kernel did not get that far)
#
# Knobs (environment):
#   GPUWARDEN_UML_CACHE    where the kernel, its modules and the C library it
#                          was built for are kept (default
#                          /var/cache/gpuwarden-uml). The first run fetches
#                          user-mode-linux and libc6 from Debian unstable
#                          through apt (which checks the archive's
#                          signatures with this machine's keyring; root
#                          only); later runs reuse them.
#   GPUWARDEN_UML_REFRESH=1  fetch the newest again
#   GPUWARDEN_UML_MEM      the kernel's memory (default 512M; a file of that
#                          size in /dev/shm while it runs)
set -euo pipefail

CACHE=${GPUWARDEN_UML_CACHE:-/var/cache/gpuwarden-uml}
MEM=${GPUWARDEN_UML_MEM:-512M}

TMPS=() # removed at exit
trap 'rm -rf "${TMPS[@]}"' EXIT

die() {
    echo "uml.sh: $*" >&2
    exit 1
}

# fetch puts a kernel in $CACHE: linux.uml (its interpreter and library
# path set to the C library beside it), lib/ and modules/VERSION/.
fetch() {
    [ -x "$CACHE/linux.uml" ] && [ "${GPUWARDEN_UML_REFRESH:-}" != 1 ] && return
    [ "$(id -u)" -eq 0 ] || die "no kernel in $CACHE, and fetching one needs root"
    command -v patchelf >/dev/null || die "patchelf is missing (make deps-test installs it)"
    local work
    work=$(mktemp -d)
    TMPS+=("$work")
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/dl" "$work/root"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" >"$work/sid.list"
    local apt=(-o "Dir::Etc::SourceList=$work/sid.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o APT::Architectures=amd64
        -o Acquire::Languages=none -o APT::Sandbox::User=root -qq)
    echo "uml.sh: fetching user-mode-linux and libc6 from Debian unstable into $CACHE" >&2
    apt-get "${apt[@]}" update
    (cd "$work/dl" && apt-get "${apt[@]}" download user-mode-linux libc6)
    for deb in "$work"/dl/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
    local new="$CACHE.new"
    rm -rf "$new"
    mkdir -p "$new"
    cp -a "$work/root/usr/lib/x86_64-linux-gnu" "$new/lib"
    cp -a "$work/root/usr/lib/uml/modules" "$new/modules"
    cp "$work/root/usr/bin/linux.uml" "$new/linux.uml"
    # The kernel needs a newer C library than the machine's may be; it is
    # a process like any other, so it gets its own. (Run through the
    # library's loader instead, it would re-execute the loader.)
    patchelf --set-interpreter "$CACHE/lib/ld-linux-x86-64.so.2" --set-rpath "$CACHE/lib" "$new/linux.uml"
    rm -rf "$CACHE"
    mv "$new" "$CACHE"
}

# init writes the script the kernel runs as its first process.
init() {
    local state=$1
    shift
    local modules
    modules=$(ls -d "$CACHE"/modules/*/ | head -1)
    {
        echo '#!/bin/sh'
        echo 'mount -t proc proc /proc; mount -t sysfs sys /sys'
        printf 'M=%q\n' "$modules"
        # A module's dependencies (modules.dep) first; busybox's insmod
        # takes a path, where the kernel looks under /lib/modules.
        echo 'load() {'
        echo '  for d in $(grep "^$1:" "$M/modules.dep" | cut -d: -f2); do load "$d"; done'
        echo '  n=$(basename "$1" .ko | tr - _); grep -q "^$n " /proc/modules || busybox insmod "$M/$1"'
        echo '}'
        echo 'for m in kernel/crypto/cryptomgr.ko kernel/crypto/ctr.ko kernel/crypto/gcm.ko kernel/net/tls/tls.ko; do'
        echo '  [ -f "$M/$m" ] && load "$m"'
        echo 'done'
        echo 'ip link set lo up'
        printf 'export PATH=%q\n' "$PATH"
        while IFS='=' read -r k v; do
            if [[ $k =~ ^GPUWARDEN_[A-Z0-9_]*$ ]]; then printf 'export %s=%q\n' "$k" "$v"; fi
        done < <(env)
        printf 'cd %q\n' "$PWD"
        printf '%q ' "$@"
        printf '>%q 2>&1\n' "$state/out"
        printf 'echo $? >%q\n' "$state/rc"
        echo 'busybox poweroff -f'
    } >"$state/init"
    chmod +x "$state/init"
}

run() {
    [ $# -gt 0 ] || die "usage: uml.sh run CMD..."
    fetch
    local state
    state=$(mktemp -d)
    TMPS+=("$state")
    init "$state" "$@"
    echo "uml.sh: booting $(ls "$CACHE/modules") (User-Mode Linux) for: $*" >&2
    "$CACHE/linux.uml" mem="$MEM" root=/dev/root rootfstype=hostfs rootflags=/ rw init="$state/init" \
        con=null con0=fd:0,fd:1 </dev/null >"$state/console" 2>&1 || true
    [ -f "$state/out" ] && cat "$state/out"
    if [ ! -f "$state/rc" ]; then
        tail -30 "$state/console" >&2
        die "the kernel stopped before the command ended (its console is above)"
    fi
    return "$(cat "$state/rc")"
}

case "${1:-}" in
run)
    shift
    run "$@"
    ;;
*) die "usage: uml.sh run CMD..." ;;
esac
