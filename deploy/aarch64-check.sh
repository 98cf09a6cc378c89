#!/usr/bin/env bash
# Prove nvllm on 64-bit ARM without a board: build a Debian arm64 root with debootstrap, run it through
# qemu's user-mode emulation (binfmt_misc), install nvllm there from this checkout as a user would
# (python3 -m venv, pip install from the package index: aarch64 wheels of numpy, grpcio, tokenizers,
# safetensors, ...), and run the tests marked `aarch64` (pytest -m aarch64): the golden tests on the
# tiny models and one daemon round trip (serve, health, a streamed answer).
#
#   sudo deploy/aarch64-check.sh            run it; exit 0 when the tests pass
#   sudo deploy/aarch64-check.sh --keep     keep the work directory (the arm64 root) for a look inside
#
# Exit status: 0 passed, 1 failed (tests or set-up), 77 emulation cannot run here (no binfmt_misc and no
# way to register it, not root, no qemu): the test that calls this script skips on 77 with the reason.
#
# Needs root (debootstrap, chroot, mounts) and, when missing, installs debootstrap, qemu-user-static and
# binfmt-support with apt-get. Works from nothing; what can be kept between runs is kept in
# $NVLLM_AARCH64_CACHE: the Debian packages debootstrap fetched, the finished base root as a tarball
# (debootstrap's second stage runs under emulation and is the slow part), and pip's download cache. The
# root every run tests in is unpacked fresh from that tarball, and the venv is made anew each time.
#
# Without binfmt_misc there is no user-mode fallback: qemu-aarch64-static given explicitly runs one
# program, but dpkg (debootstrap's second stage) and the daemon test start further programs, which the
# kernel could not run. A whole emulated machine (qemu-system-aarch64) would need a kernel and a boot
# image from outside the package registries this project may use, so this script stops with 77 instead.
#
# Environment (defaults in brackets):
#   NVLLM_AARCH64_CACHE [~/.cache/nvllm/aarch64]   what is kept between runs (see above)
#   NVLLM_AARCH64_SUITE [bookworm]                 Debian release of the root (bookworm: Python 3.11)
#   NVLLM_AARCH64_MIRROR [the host's Debian mirror, from its apt sources; else debootstrap's default]
#   NVLLM_AARCH64_PYTEST ["-m aarch64 -W error::RuntimeWarning"]   what pytest runs under emulation
#   NVLLM_AARCH64_CPU [cortex-a76]                 the core qemu emulates (QEMU_CPU). A Jetson Orin's
#                                                  Cortex-A78AE is ARMv8.2 with dot product and FP16, as
#                                                  the A76 is; "max" adds SVE and SME, for which OpenBLAS
#                                                  picks other kernels (see docs/testing.md, "aarch64").
#   NVLLM_AARCH64_NO_APT=1                         never apt-get install the host tools (fail with 77)
# shellcheck disable=SC2317  # functions run from main and the EXIT trap, which shellcheck cannot follow
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
checkout="$(dirname "$here")"
CACHE="${NVLLM_AARCH64_CACHE:-${HOME:-/root}/.cache/nvllm/aarch64}"
SUITE="${NVLLM_AARCH64_SUITE:-bookworm}"
PYTEST_ARGS="${NVLLM_AARCH64_PYTEST:--m aarch64 -W error::RuntimeWarning}"
QEMU_CPU_MODEL="${NVLLM_AARCH64_CPU:-cortex-a76}"
# Bump when the base root's package list changes, so a stale cached tarball is not reused.
BASE_VERSION=2
# gcc and libc6-dev: pip builds nvllm's C kernels (model/csrc) there, as it would on a board.
BASE_PACKAGES="python3,python3-venv,ca-certificates,gcc,libc6-dev"
VENV=/opt/nvllm/venv
EXIT_SKIP=77

say() { echo "aarch64-check: $*"; }
skip() { echo "aarch64-check: SKIP: $*" >&2; exit "$EXIT_SKIP"; }
die() { echo "aarch64-check: FAILED: $*" >&2; exit 1; }
now() { date +%s; }
elapsed() { echo "$(( $(now) - $1 )) s"; }

# -- inside a private mount namespace: unpack the root, mount, install, test ------------------------
run_inside() {
    local work="$1" root base t mirror where machine rc
    root="$work/root"
    base="$CACHE/base-$SUITE-arm64-v$BASE_VERSION.tar"
    # Mounts made here vanish with the namespace; private propagation keeps them off the host.
    mount --make-rprivate /

    t=$(now)
    if [ -f "$base" ]; then
        say "unpacking the cached base root ($base)"
        mkdir -p "$root"
        tar -C "$root" -xpf "$base"
    else
        mirror="${NVLLM_AARCH64_MIRROR:-}"
        if [ -z "$mirror" ]; then
            # The host's own Debian mirror (deb822 or one-line sources), so a proxied mirror is used too.
            mirror="$(sed -n 's/^URIs: *\([^ ]*\/debian\)\/\{0,1\}$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)"
            [ -n "$mirror" ] || mirror="$(sed -n 's/^deb  *\(\[[^]]*\]  *\)\{0,1\}\([^ ]*\/debian\)\/\{0,1\} .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -n1 || true)"
        fi
        mkdir -p "$CACHE/debs"
        where="the default mirror of debootstrap"
        [ -z "$mirror" ] || where="the mirror in the host's apt sources"
        say "debootstrap $SUITE arm64 from $where; the second stage runs under qemu (minutes)"
        # shellcheck disable=SC2086  # an empty mirror must vanish, not become ""
        debootstrap --arch=arm64 --variant=minbase --include="$BASE_PACKAGES" --cache-dir="$CACHE/debs" \
            "$SUITE" "$root" $mirror > "$work/debootstrap.log" 2>&1 \
            || { tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
        rm -rf "$root/var/cache/apt/archives/"*.deb
        tar -C "$root" -cpf "$base.tmp" . && mv "$base.tmp" "$base"
        say "base root built and cached in $(elapsed "$t")"
    fi
    say "base root ready in $(elapsed "$t")"

    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t sysfs sysfs "$root/sys" 2>/dev/null || true
    mount -t tmpfs tmpfs "$root/tmp"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    mkdir -p "$CACHE/pip" "$root/root/.cache/pip"
    mount --bind "$CACHE/pip" "$root/root/.cache/pip"

    # The checkout as pip would see it, without the host's venv, git data or pulled models.
    mkdir -p "$root/src"
    tar -C "$checkout" --exclude=./.git --exclude=./.venv --exclude='./models/*/' --exclude=./build --exclude='*.so' \
        --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache --exclude=.hypothesis -cf - . \
        | tar -C "$root/src" -xf -

    # The host's certificate authorities go with pip: where HTTPS passes through an inspecting proxy, the
    # proxy's CA is in the host's bundle (or $PIP_CERT), not in the fresh root's.
    local ca="${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}"
    local pip_cert=()
    if [ -f "$ca" ]; then
        cp -L "$ca" "$root/etc/ssl/host-ca-bundle.crt"
        pip_cert=(PIP_CERT=/etc/ssl/host-ca-bundle.crt)
    fi

    in_root() {
        # A clean environment: the host's pip settings (local wheel folders, indexes) do not apply there.
        chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
            QEMU_CPU="$QEMU_CPU_MODEL" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 \
            PYTHONDONTWRITEBYTECODE=1 "${pip_cert[@]}" "$@"
    }
    machine="$(in_root /usr/bin/python3 -c 'import platform, sys; print(platform.machine(), sys.version.split()[0])')" \
        || die "python3 does not run in the arm64 root"
    say "emulated: $machine on a $QEMU_CPU_MODEL core (QEMU_CPU)"
    case "$machine" in aarch64*) ;; *) die "the root's python3 reports '$machine', not aarch64" ;; esac

    t=$(now)
    say "python3 -m venv $VENV && pip install '/src[test]'"
    in_root /usr/bin/python3 -m venv "$VENV"
    in_root "$VENV/bin/pip" install --no-input --progress-bar off "/src[test]" > "$work/pip.log" 2>&1 \
        || { tail -n 40 "$work/pip.log" >&2; die "pip install failed (log above)"; }
    grep -E '^Successfully installed' "$work/pip.log" | tr ' ' '\n' | grep -E '^(numpy|grpcio|tokenizers|safetensors|protobuf|psutil)-' \
        | tr '\n' ' ' | sed 's/^/aarch64-check: installed: /; s/ $/\n/'
    say "installed in $(elapsed "$t")"
    say "OpenBLAS core: $(in_root "$VENV/bin/python" -c 'import numpy; numpy.show_runtime()' 2>/dev/null \
        | sed -n "s/.*'architecture': '\([^']*\)'.*/\1/p" | head -n1)"

    t=$(now)
    say "python -m pytest $PYTEST_ARGS (under emulation)"
    set +e
    # shellcheck disable=SC2086  # PYTEST_ARGS holds several arguments
    in_root /bin/sh -c "cd /src && exec $VENV/bin/python -m pytest -q -p no:cacheprovider $PYTEST_ARGS"
    rc=$?
    set -e
    say "tests ran in $(elapsed "$t") (pytest exit $rc)"
    exit "$rc"
}

# -- outside: tools, binfmt, a work directory, then the inner part in its own mount namespace ----------
run_outside() {
    local start native need binfmt interp magic mask flags rc
    start=$(now)
    [ "$(uname -s)" = Linux ] || skip "needs Linux (binfmt_misc), this is $(uname -s)"
    [ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap, chroot and mounts); run it with sudo"
    case "$(uname -m)" in
        aarch64|arm64) native=1 ;;
        *) native=0 ;;
    esac

    need=()
    command -v debootstrap >/dev/null || need+=(debootstrap)
    command -v unshare >/dev/null || need+=(util-linux)
    if [ "$native" = 0 ] && [ ! -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] && ! command -v qemu-aarch64-static >/dev/null; then
        need+=(qemu-user-static binfmt-support)
    fi
    if [ ${#need[@]} -gt 0 ]; then
        [ "${NVLLM_AARCH64_NO_APT:-0}" != 1 ] || skip "missing ${need[*]} and NVLLM_AARCH64_NO_APT=1"
        command -v apt-get >/dev/null || skip "missing ${need[*]} and no apt-get to install them"
        say "installing ${need[*]}"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; } >/dev/null 2>&1 \
            || skip "could not install ${need[*]} with apt-get"
    fi

    if [ "$native" = 0 ]; then
        binfmt=/proc/sys/fs/binfmt_misc
        if [ ! -e "$binfmt/register" ]; then
            mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null \
                || skip "binfmt_misc is not mounted and cannot be mounted here (a container without it?)"
        fi
        if [ ! -e "$binfmt/qemu-aarch64" ]; then
            if command -v update-binfmts >/dev/null; then update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true; fi
        fi
        if [ ! -e "$binfmt/qemu-aarch64" ]; then
            # Register by hand: the F flag opens the interpreter now, so it works inside the chroot too.
            interp=/usr/libexec/qemu-binfmt/aarch64-binfmt-P
            [ -x "$interp" ] || interp="$(command -v qemu-aarch64-static || true)"
            [ -n "$interp" ] || skip "no qemu-aarch64-static to register"
            magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
            mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
            flags=F
            case "$interp" in *-P) flags=PF ;; esac   # Debian's wrapper expects argv[0] preserved
            echo ":qemu-aarch64:M::$magic:$mask:$interp:$flags" > "$binfmt/register" 2>/dev/null \
                || skip "cannot register qemu-aarch64 with binfmt_misc (read-only or not permitted here)"
        fi
        [ "$(cat "$binfmt/status" 2>/dev/null)" = enabled ] || skip "binfmt_misc is disabled ($binfmt/status)"
        grep -q '^enabled' "$binfmt/qemu-aarch64" 2>/dev/null || skip "the qemu-aarch64 binfmt entry is disabled"
        grep -q '^flags:.*F' "$binfmt/qemu-aarch64" \
            || skip "qemu-aarch64 is registered without the F flag, so it cannot run inside a chroot"
        say "binfmt_misc: qemu-aarch64 registered ($(sed -n 's/^interpreter //p' "$binfmt/qemu-aarch64"))"
    fi

    mkdir -p "$CACHE"
    work="$(mktemp -d "${TMPDIR:-/tmp}/nvllm-aarch64.XXXXXX")"
    cleanup() {
        if [ "$keep" = 1 ]; then
            say "kept $work (the root is $work/root)"
        else
            # Nothing is mounted under $work out here (the mounts lived in the inner namespace).
            rm -rf --one-file-system "$work"
        fi
    }
    trap cleanup EXIT
    say "work directory $work, cache $CACHE"
    set +e
    unshare --mount --propagation private bash "$here/aarch64-check.sh" --inner "$work"
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
        say "PASSED in $(elapsed "$start")"
    else
        say "FAILED (exit $rc) after $(elapsed "$start")"
    fi
    exit "$rc"
}

# Everything runs from functions, which bash reads whole before running: editing this file while a check
# runs does not change the running one.
main() {
    keep=0
    local inner=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --keep) keep=1 ;;
            --inner) inner="$2"; shift ;;   # internal: the part that runs in a private mount namespace
            -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '/^# shellcheck/d; $d; s/^# \{0,1\}//'; exit 0 ;;
            *) echo "aarch64-check: unknown argument: $1 (try --help)" >&2; exit 2 ;;
        esac
        shift
    done
    if [ -n "$inner" ]; then
        run_inside "$inner"
    else
        run_outside
    fi
}

main "$@"; exit
