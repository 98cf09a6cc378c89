#!/usr/bin/env bash
# Install nvllm as a systemd service: system user, venv, config, default model, unit.
#
#   sudo deploy/install.sh            install (or upgrade) and enable; does not start
#   sudo deploy/install.sh --start    ... and (re)start the service
#
# Safe to run again: an existing user, venv, model and /etc/nvllm/nvllm.toml are kept (the config is
# never overwritten; compare it with deploy/nvllm.toml after an upgrade), the package and unit are
# reinstalled.
#
# Environment (defaults in brackets):
#   NVLLM_ROOT [/]                    root the paths below are installed under, DESTDIR-style (tests,
#                                     images); the unit and config still name the paths without it.
#                                     With a root other than /, no user is created and `systemctl
#                                     --root` only links the unit; nothing is reloaded or started (the
#                                     same offline linking happens on a system not booted with systemd).
#   NVLLM_VENV [/opt/nvllm/venv]      the virtual environment the unit runs nvllm from
#   NVLLM_ETC [/etc/nvllm]            config directory (nvllm.toml)
#   NVLLM_STATE [/var/lib/nvllm]      state directory; models go to $NVLLM_STATE/models
#   NVLLM_UNIT_DIR [/etc/systemd/system]
#   NVLLM_SOURCE [this checkout]      what pip installs: a checkout, or a built nvllm-*.whl
#   NVLLM_PYTHON [python3]            interpreter for the venv (3.10 or newer)
#   NVLLM_PIP_ARGS []                 extra pip arguments, e.g. "--no-index --find-links /srv/wheels"
#   NVLLM_MODEL [smollm2-135m-instruct]   model to pull: its GGUF, $NVLLM_STATE/models/NAME.gguf, which
#                                     nvllm.toml's model.path names
#   NVLLM_HTTP_LISTEN []              on a first install, turn the OpenAI-compatible HTTP API on at this
#                                     host:port (http.listen) with a fresh random key in $NVLLM_ETC/api_key
#                                     (http.api_key_file; mode 0640, group nvllm)
#   NVLLM_SKIP_USER=1, NVLLM_SKIP_PIP=1, NVLLM_SKIP_PULL=1, NVLLM_SKIP_SYSTEMCTL=1   skip that step
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

prog=install.sh
start=0
for arg in "$@"; do
    case "$arg" in
        --start) start=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

# shellcheck source=paths.sh
. "$here/paths.sh"
NVLLM_SOURCE="${NVLLM_SOURCE:-$(dirname "$here")}"
NVLLM_PYTHON="${NVLLM_PYTHON:-python3}"
NVLLM_PIP_ARGS="${NVLLM_PIP_ARGS:-}"
NVLLM_MODEL="${NVLLM_MODEL:-smollm2-135m-instruct}"
unit_dir="$root$NVLLM_UNIT_DIR"

if [ -z "$root" ] && [ "$(id -u)" -ne 0 ]; then
    die "run as root (sudo), or set NVLLM_ROOT to install under another directory"
fi
case "$NVLLM_SOURCE" in
    *.whl) [ -f "$NVLLM_SOURCE" ] || die "NVLLM_SOURCE=$NVLLM_SOURCE does not exist" ;;
    *) [ -f "$NVLLM_SOURCE/pyproject.toml" ] || die "NVLLM_SOURCE=$NVLLM_SOURCE is not an nvllm checkout" ;;
esac

have_user() { [ -z "$root" ] && getent passwd "$SERVICE_USER" >/dev/null; }

# 1. The service user: a system account without a login shell; its home is the state directory.
if [ "${NVLLM_SKIP_USER:-0}" = 1 ]; then
    say "skipping user creation (NVLLM_SKIP_USER=1)"
elif [ -n "$root" ]; then
    say "skipping user creation under NVLLM_ROOT=$NVLLM_ROOT (create '$SERVICE_USER' on the target)"
elif getent passwd "$SERVICE_USER" >/dev/null; then
    say "user $SERVICE_USER exists"
else
    say "creating system user $SERVICE_USER"
    useradd --system --user-group --home-dir "$NVLLM_STATE" --no-create-home \
        --shell /usr/sbin/nologin --comment "nvllm LLM serving daemon" "$SERVICE_USER"
fi

# 2. The venv: a clean one (no system site-packages), so the daemon runs the versions pip resolved.
if [ -x "$venv/bin/python" ]; then
    say "using the venv at $venv"
else
    "$NVLLM_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "$NVLLM_PYTHON is older than Python 3.10"
    say "creating the venv at $venv"
    mkdir -p "$(dirname "$venv")"
    "$NVLLM_PYTHON" -m venv "$venv" \
        || die "could not create a venv (on Debian/Ubuntu: apt-get install python3-venv)"
fi

# 3. nvllm itself (gguf, which `nvllm models pull` needs, is a core dependency). pip builds from a copy of the
#    checkout so the build leaves nothing behind in it (and skips .venv, .git and pulled models).
if [ "${NVLLM_SKIP_PIP:-0}" = 1 ]; then
    say "skipping pip install (NVLLM_SKIP_PIP=1)"
else
    case "$NVLLM_SOURCE" in
        *.whl) package="$NVLLM_SOURCE" ;;
        *)
            package="$(mktemp -d)"
            trap 'rm -rf "$package"' EXIT
            tar -C "$NVLLM_SOURCE" --exclude=./.git --exclude=./.venv --exclude=./models --exclude=./build \
                --exclude='*.egg-info' --exclude='*.so' --exclude=__pycache__ --exclude=.pytest_cache -cf - . \
                | tar -C "$package" -xf - ;;
    esac
    say "installing nvllm from $NVLLM_SOURCE"
    command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 \
        || say "no C compiler (cc, gcc): nvllm will run its slower NumPy paths; apt-get install gcc for its C kernels"
    # Word splitting of NVLLM_PIP_ARGS is wanted: it holds several arguments.
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --upgrade $NVLLM_PIP_ARGS \
        "${package}"
    [ -x "$venv/bin/nvllm" ] || die "pip finished but $venv/bin/nvllm is missing"
fi

# 4. The config, only if there is none: an admin's edits survive every upgrade.
install -d -m 0755 "$etc"
if [ -e "$etc/nvllm.toml" ]; then
    say "keeping the existing $etc/nvllm.toml"
else
    say "installing $etc/nvllm.toml"
    install -m 0640 "$here/nvllm.toml" "$etc/nvllm.toml"
    if have_user; then chgrp "$SERVICE_USER" "$etc/nvllm.toml"; fi
    if [ -n "${NVLLM_HTTP_LISTEN:-}" ]; then
        case "$NVLLM_HTTP_LISTEN" in
            *[!A-Za-z0-9.:_\[\]-]*) die "NVLLM_HTTP_LISTEN must be host:port, got '$NVLLM_HTTP_LISTEN'" ;;
        esac
        if [ ! -e "$etc/api_key" ]; then
            (umask 0137 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$etc/api_key")
            if have_user; then chgrp "$SERVICE_USER" "$etc/api_key"; fi
        fi
        sed -i -e "/^\[http\]/,/^\[/ s#^listen = \"\"#listen = \"$NVLLM_HTTP_LISTEN\"#" \
            -e "/^\[http\]/,/^\[/ s#^api_key_file = \"\"#api_key_file = \"$NVLLM_ETC/api_key\"#" "$etc/nvllm.toml"
        say "HTTP API on $NVLLM_HTTP_LISTEN (http.listen); clients send the key in $NVLLM_ETC/api_key"
    fi
fi

# 5. State directory and the default model. systemd's StateDirectory= would chown it on start anyway.
install -d -m 0750 "$state" "$state/models"
if [ "${NVLLM_SKIP_PULL:-0}" = 1 ]; then
    say "skipping the model pull (NVLLM_SKIP_PULL=1)"
elif [ -f "$state/models/$NVLLM_MODEL.gguf" ]; then
    say "model $NVLLM_MODEL.gguf is already in $state/models"
else
    say "pulling $NVLLM_MODEL into $state/models"
    "$venv/bin/nvllm" models pull "$NVLLM_MODEL" --dir "$state/models"
fi
if have_user; then chown -R "$SERVICE_USER:$SERVICE_USER" "$state"; fi

# 6. The unit, pointed at the paths chosen above (with the defaults it equals deploy/nvllm.service).
install -d -m 0755 "$unit_dir"
unit_tmp="$(mktemp)"
sed -e "s#^ExecStart=.*#ExecStart=$NVLLM_VENV/bin/nvllm serve --config $NVLLM_ETC/nvllm.toml#" \
    -e "s#^WorkingDirectory=.*#WorkingDirectory=$NVLLM_STATE#" \
    -e "s#^Documentation=file:.*#Documentation=file:$NVLLM_ETC/nvllm.toml#" \
    "$here/nvllm.service" > "$unit_tmp"
install -m 0644 "$unit_tmp" "$unit_dir/nvllm.service"
rm -f "$unit_tmp"
say "installed $unit_dir/nvllm.service"

# 7. Enable (and on request start) it.
if [ "${NVLLM_SKIP_SYSTEMCTL:-0}" = 1 ]; then
    say "skipping systemctl (NVLLM_SKIP_SYSTEMCTL=1)"
elif [ -n "$root" ] || [ ! -d /run/systemd/system ]; then
    # A staging root, or a system not booted with systemd (a chroot, a container): link it offline.
    systemctl --root="${root:-/}" enable nvllm.service
else
    systemctl daemon-reload
    systemctl enable nvllm.service
    if [ "$start" = 1 ]; then
        systemctl restart nvllm.service
        say "started; follow it with: journalctl -u nvllm -f"
    else
        say "enabled; start it with: systemctl start nvllm"
    fi
fi
say "done"
