#!/usr/bin/env bash
# Prove nvllm on 64-bit ARM without a board: make a Debian arm64 root, run it through qemu's user-mode
# emulation (binfmt_misc), install nvllm there from this checkout with pip (python3 -m venv; its C kernels
# built by the root's arm64 gcc), and run the tests marked `aarch64` (pytest -m aarch64) on an emulated
# Cortex-A76: the golden tests on the tiny models, the C kernels against their NumPy twins (NEON, NEON with
# the dot product, portable C) and one daemon round trip (serve, health, a streamed answer).
#
#   sudo deploy/aarch64-check.sh            run it; exit 0 when the tests pass
#   sudo deploy/aarch64-check.sh --keep     keep the work directory (the arm64 root) for a look inside
#
# Exit status: 0 passed, 1 failed (tests or set-up), 77 emulation cannot run here (no binfmt_misc and no
# way to register it, not root, no qemu): the test that calls this script skips on 77 with the reason.
#
# Emulation is slow (gcc and Python run 4 to 7 times slower there), so only what must run as arm64 runs
# emulated. On a 2-core x86-64 a cold run takes about 11 minutes, 8 of them gcc building the kernels
# (measured with the old one-file qdot.c: about 7 minutes of it; the kernels are one file per instruction
# set now; its debug information left out as said below).
#  - The root: debootstrap's first stage (on the host) fetches minbase with python3, python3-venv, gcc and
#    libc6-dev and unpacks the required packages; the rest are unpacked on the host too (dpkg-deb), and of
#    debootstrap's second stage (dpkg and the maintainer scripts under emulation) only what this check
#    needs is done: users and groups, the cc link, ldconfig (emulated), the standard library byte-compiled
#    (on the host when its Python is the root's version). It has no dpkg database: a root to run Python
#    and gcc in, not to apt-get in.
#  - The wheels: pip on the host fetches the aarch64 wheels (manylinux, for the root's Python and glibc) of
#    nvllm's dependencies, its [test] extra and pytest-xdist; pip in the root installs from them offline,
#    so neither pip's resolver nor its downloads run emulated.
#  - In the root: python3 -m venv; `pip wheel /src` builds nvllm while, on the other core, pip installs
#    the dependencies and the tiny test models are written; pip installs the built wheel with [test]; then
#    pytest, on every core (at most 4). The build runs with CFLAGS=-g0: without the debug information that
#    Python's flags ask for GCC makes the same code, and under emulation writing it more than doubles the
#    build. setup.py's flags (-O3 ...) stay as they are.
#
# Needs root (debootstrap, chroot, mounts) and, when missing, installs debootstrap, qemu-user-static,
# binfmt-support and python3 with apt-get. Works from nothing; what can be kept between runs is kept in
# $NVLLM_AARCH64_CACHE: the Debian packages debootstrap fetched, the finished base root as a tarball, and
# the host pip's download cache. The root every run tests in is unpacked fresh from that tarball, and the
# venv is made and nvllm built anew each time.
#
# Without binfmt_misc there is no user-mode fallback: qemu-aarch64-static given explicitly runs one
# program, but gcc, pip and the daemon test start further programs, which the kernel could not run. A
# whole emulated machine (qemu-system-aarch64) would need a kernel and a boot image from outside the
# package registries this project may use, so this script stops with 77 instead.
#
# Environment (defaults in brackets):
#   NVLLM_AARCH64_CACHE [~/.cache/nvllm/aarch64]   what is kept between runs (see above)
#   NVLLM_AARCH64_SUITE [bookworm]                 Debian release of the root (bookworm: Python 3.11)
#   NVLLM_AARCH64_MIRROR [the host's Debian mirror, from its apt sources; else debootstrap's default]
#   NVLLM_AARCH64_PYTEST ["-m aarch64 -W error::RuntimeWarning"]   what pytest runs under emulation
#   NVLLM_AARCH64_JOBS [the host's cores, at most 4]  pytest's workers there (pytest -n; 1: no xdist)
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
# pytest's workers (pytest-xdist): each is one emulated process, so one per host core, at most 4.
JOBS="${NVLLM_AARCH64_JOBS:-$(n=$(nproc 2>/dev/null || echo 1); echo $(( n < 4 ? n : 4 )))}"
# Bump when the base root's package list changes, so a stale cached tarball is not reused.
BASE_VERSION=3
# gcc and libc6-dev: pip builds nvllm's C kernels (model/kernels/csrc) there, as it would on a board. No
# ca-certificates: pip never goes online in the root.
BASE_PACKAGES="python3,python3-venv,gcc,libc6-dev"
VENV=/opt/nvllm/venv
EXIT_SKIP=77

say() { echo "aarch64-check: $*"; }
skip() { echo "aarch64-check: SKIP: $*" >&2; exit "$EXIT_SKIP"; }
die() { echo "aarch64-check: FAILED: $*" >&2; exit 1; }
now() { date +%s; }
elapsed() { echo "$(( $(now) - $1 )) s"; }

# -- the base root: debootstrap's first stage, every package unpacked natively, no second stage ------------
# The host's own Debian mirror (deb822 or one-line sources), so a proxied mirror is used too.
host_mirror() {
    local mirror="${NVLLM_AARCH64_MIRROR:-}"
    if [ -z "$mirror" ]; then
        mirror="$(sed -n 's/^URIs: *\([^ ]*\/debian\)\/\{0,1\}$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)"
        [ -n "$mirror" ] || mirror="$(sed -n 's/^deb  *\(\[[^]]*\]  *\)\{0,1\}\([^ ]*\/debian\)\/\{0,1\} .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -n1 || true)"
    fi
    echo "$mirror"
}

build_base() {
    local root="$1" log="$2" mirror where required name path pyver
    mirror="$(host_mirror)"
    mkdir -p "$CACHE/debs"
    where="the default mirror of debootstrap"
    [ -z "$mirror" ] || where="the mirror in the host's apt sources"
    say "debootstrap --foreign $SUITE arm64 from $where (first stage only: natively)"
    # shellcheck disable=SC2086  # an empty mirror must vanish, not become ""
    debootstrap --foreign --arch=arm64 --variant=minbase --include="$BASE_PACKAGES" --cache-dir="$CACHE/debs" \
        "$SUITE" "$root" $mirror > "$log" 2>&1 \
        || { tail -n 30 "$log" >&2; die "debootstrap failed (log above)"; }
    # The first stage fetched every package and unpacked the required ones; the rest (python3, gcc, ...) are
    # unpacked here the same way (tar -k keeps merged /usr's /bin -> usr/bin and the like).
    required=" $(tr '\n' ' ' < "$root/debootstrap/required") "
    while read -r name path; do
        case "$required" in *" $name "*) continue ;; esac
        dpkg-deb --fsys-tarfile "$root/$path" | tar -C "$root" -k -xf - \
            || die "could not unpack $path into the root"
    done < "$root/debootstrap/debpaths"
    # What the packages' maintainer scripts would do that the check needs: users and groups (base-passwd),
    # the cc link (gcc's alternative), the loader's cache (libc-bin; this one runs under emulation).
    [ -e "$root/etc/passwd" ] || cp "$root/usr/share/base-passwd/passwd.master" "$root/etc/passwd"
    [ -e "$root/etc/group" ] || cp "$root/usr/share/base-passwd/group.master" "$root/etc/group"
    [ -e "$root/usr/bin/cc" ] || ln -s gcc "$root/usr/bin/cc"
    # In a container debootstrap makes /proc a link to the host's (its second stage undoes that); proc is
    # mounted there instead.
    if [ -L "$root/proc" ]; then rm -f "$root/proc" && mkdir -m 555 "$root/proc"; fi
    chroot "$root" /sbin/ldconfig || die "ldconfig does not run in the arm64 root (emulation broken?)"
    # And Python's: the standard library byte-compiled (bytecode does not depend on the machine), natively
    # where the host's Python is the root's version, else under emulation.
    pyver="$(root_python_version "$root")"
    if [ -n "$HOST_PYTHON" ] && [ "$("$HOST_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$pyver" ]; then
        "$HOST_PYTHON" -m compileall -q -j 0 -s "$root" -p / "$root/usr/lib/python$pyver" > /dev/null 2>&1 || true
    else
        chroot "$root" "/usr/bin/python$pyver" -m compileall -q "/usr/lib/python$pyver" > /dev/null 2>&1 || true
    fi
    rm -rf "$root/debootstrap" "$root/var/cache/apt/archives/"*.deb
}

# "3.11" for a root whose Python is 3.11
root_python_version() {
    find "$1/usr/lib" -maxdepth 1 -name 'python3.*' -printf '%f\n' | sed -n 's/^python\(3\.[0-9]*\)$/\1/p' | sort -V | tail -n1
}

# pip on the host, with none of the host's pip settings (local wheel folders, indexes, constraints): its
# own pip where it has one, else the pip wheel of the root (python3-pip-whl), which runs as it is.
host_pip() {
    local pip=("$HOST_PYTHON" -m pip) env=() whl v
    if ! "$HOST_PYTHON" -m pip --version > /dev/null 2>&1; then
        whl=("$ROOT"/usr/share/python-wheels/pip-*.whl)
        pip=("$HOST_PYTHON" "${whl[0]}/pip")
    fi
    for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
        [ -z "${!v:-}" ] || env+=("$v=${!v}")
    done
    env -i PATH="$PATH" HOME="${HOME:-/root}" LANG=C.UTF-8 PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 \
        PIP_DEFAULT_TIMEOUT=180 PIP_CACHE_DIR="$CACHE/pip" "${PIP_CERT_ENV[@]}" "${env[@]}" "${pip[@]}" "$@"
}

# -- inside a private mount namespace: unpack the root, fetch the wheels, install, test -----------------
run_inside() {
    local work="$1" root base t machine rc pyver glibc plats m wheels pid_fetch pid_build pid_deps rc_deps blas
    root="$work/root"
    ROOT="$root"
    # The interpreter itself, not a shim that needs the caller's environment (pip runs with env -i).
    HOST_PYTHON="$(python3 -c 'import sys; print(sys.executable)')" || die "python3 does not run on the host"
    base="$CACHE/base-$SUITE-arm64-v$BASE_VERSION.tar"
    # Mounts made here vanish with the namespace; private propagation keeps them off the host.
    mount --make-rprivate /

    # The host's certificate authorities go with pip: where HTTPS passes through an inspecting proxy, the
    # proxy's CA is in the host's bundle (or $PIP_CERT).
    local ca="${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}"
    PIP_CERT_ENV=()
    [ ! -f "$ca" ] || PIP_CERT_ENV=("PIP_CERT=$ca")

    t=$(now)
    if [ -f "$base" ]; then
        say "unpacking the cached base root ($base)"
        mkdir -p "$root"
        tar -C "$root" -xpf "$base"
    else
        build_base "$root" "$work/debootstrap.log"
        tar -C "$root" -cpf "$base.tmp" . && mv "$base.tmp" "$base"
        say "base root built and cached in $(elapsed "$t")"
    fi
    say "base root ready in $(elapsed "$t")"

    # The checkout as pip would see it, without the host's venv, git data or pulled models.
    mkdir -p "$root/src"
    tar -C "$checkout" --exclude=./.git --exclude=./.venv --exclude='./models/*/' --exclude=./build --exclude='*.so' \
        --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache --exclude=.hypothesis -cf - . \
        | tar -C "$root/src" -xf -

    # The wheels, fetched on the host for the root's Python and C library, so that neither pip's resolver
    # nor its downloads run under emulation: setuptools for the build, and the closure pip resolves from the
    # checkout's pyproject.toml for nvllm and its [test] extra, with pytest-xdist (the tests run on every
    # core). This runs while the venv is made under emulation.
    pyver="$(root_python_version "$root")"
    [ -n "$pyver" ] || die "no python3 in the arm64 root"
    glibc="$(LC_ALL=C grep -aom1 'release version 2\.[0-9]*' "$root/usr/lib/aarch64-linux-gnu/libc.so.6" | sed 's/.*2\.//')"
    [ -n "$glibc" ] || die "cannot tell the root's C library version"
    plats=()
    for ((m = glibc; m >= 17; m--)); do plats+=(--platform "manylinux_2_${m}_aarch64"); done
    wheels="$work/wheels"
    mkdir -p "$wheels/run" "$wheels/build"
    t=$(now)
    say "fetching aarch64 wheels for Python $pyver and glibc 2.$glibc (natively), making the venv (emulated)"
    { host_pip download --only-binary=:all: --python-version "$pyver" --progress-bar off -d "$wheels/build" \
          "setuptools>=64" \
      && host_pip download --only-binary=:all: "${plats[@]}" --platform manylinux2014_aarch64 --python-version "$pyver" \
          --implementation cp --abi "cp${pyver/./}" --progress-bar off -d "$wheels/run" "$root/src[test]" pytest-xdist \
      && rm -rf "$root/src/daemon/"*.egg-info; } > "$work/download.log" 2>&1 &   # (the metadata pip made here)
    pid_fetch=$!

    for m in proc dev sys tmp; do
        [ ! -L "$root/$m" ] || die "$root/$m is a symbolic link: mounting there would follow it out of the root"
    done
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t sysfs sysfs "$root/sys" 2>/dev/null || true
    mount -t tmpfs tmpfs "$root/tmp"
    mkdir -p "$root/opt/wheels"
    mount --bind "$wheels" "$root/opt/wheels"

    in_root() {
        # A clean environment: the host's pip settings do not apply there, and pip never goes online.
        chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
            QEMU_CPU="$QEMU_CPU_MODEL" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1 PIP_NO_CACHE_DIR=1 \
            PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off PYTHONDONTWRITEBYTECODE=1 "$@"
    }
    machine="$(in_root /usr/bin/python3 -c 'import platform, sys; print(platform.machine(), sys.version.split()[0])')" \
        || die "python3 does not run in the arm64 root"
    say "emulated: $machine on a $QEMU_CPU_MODEL core (QEMU_CPU)"
    case "$machine" in aarch64*) ;; *) die "the root's python3 reports '$machine', not aarch64" ;; esac
    in_root /usr/bin/python3 -m venv "$VENV" || die "python3 -m venv failed"
    wait "$pid_fetch" || { tail -n 30 "$work/download.log" >&2; die "fetching the wheels failed (log above)"; }
    say "venv made and $(find "$wheels/run" -name '*.whl' | wc -l) wheels fetched in $(elapsed "$t")"

    # Building nvllm is the long part (its C kernels, by gcc under emulation): pip builds
    # the wheel from /src while a second pip installs the dependencies on the other core and the tiny test
    # models are written; then pip installs the built wheel with its [test] extra, checking the set. CFLAGS=-g0
    # drops the debug information Python's own flags ask for (-g): GCC makes the same code either way, and
    # under emulation writing it more than doubles the build. setup.py's flags (-O3 ...) stay as they are.
    t=$(now)
    say "pip wheel /src (the C kernels, by the root's gcc) beside pip install of the dependencies (emulated)"
    in_root CFLAGS=-g0 "$VENV/bin/pip" wheel --no-deps --find-links /opt/wheels/build -w /tmp/dist /src \
        > "$work/build.log" 2>&1 &
    pid_build=$!
    in_root /bin/sh -c "$VENV/bin/pip install --find-links /opt/wheels/run /opt/wheels/run/*.whl \
        && cd /src && $VENV/bin/python models/make_test_models.py --out models" > "$work/deps.log" 2>&1 &
    pid_deps=$!
    rc_deps=0; wait "$pid_deps" || rc_deps=$?
    if [ "$rc_deps" != 0 ]; then
        kill "$pid_build" 2>/dev/null || true
        tail -n 40 "$work/deps.log" >&2; die "pip install of the dependencies failed (log above)"
    fi
    say "dependencies installed in $(elapsed "$t")"
    wait "$pid_build" || { tail -n 40 "$work/build.log" >&2; die "pip wheel /src failed (log above)"; }
    say "nvllm built in $(elapsed "$t")"
    in_root /bin/sh -c "set -- /tmp/dist/nvllm-*.whl && exec $VENV/bin/pip install --find-links /opt/wheels/run \"\$1[test]\"" \
        > "$work/pip.log" 2>&1 || { tail -n 40 "$work/pip.log" >&2; die "pip install of nvllm failed (log above)"; }
    cat "$work/deps.log" "$work/pip.log" | grep -E '^Successfully installed' | tr ' ' '\n' \
        | grep -E '^(nvllm|numpy|grpcio|tokenizers|safetensors|protobuf|psutil)-' | sort | tr '\n' ' ' \
        | sed 's/^/aarch64-check: installed: /; s/ $/\n/'
    # The kernels are optional in setup.py (no compiler: NumPy stands in); here they must have been built.
    blas="$(in_root "$VENV/bin/python" -c 'import numpy, nvllm.model.kernels.ops as o, nvllm.model.kernels.matmul as m
assert o.lib is not None and m.lib is not None, "no C kernels"
numpy.show_runtime()')" || die "nvllm's C kernels were not built (see $work/build.log)"
    say "installed in $(elapsed "$t"); OpenBLAS core: $(echo "$blas" | sed -n "s/.*'architecture': '\([^']*\)'.*/\1/p" | head -n1)"

    t=$(now)
    local args="$PYTEST_ARGS"
    [ "$JOBS" -le 1 ] || args="$args -n $JOBS"
    say "python -m pytest $args (under emulation)"
    set +e
    # shellcheck disable=SC2086  # args holds several arguments
    in_root /bin/sh -c "cd /src && exec $VENV/bin/python -m pytest -q -p no:cacheprovider $args"
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
    command -v python3 >/dev/null || need+=(python3)   # runs pip on the host (the wheels) and compileall
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
