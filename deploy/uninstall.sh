#!/usr/bin/env bash
# Remove nvllm: stop and disable the service, remove the unit, the venv and the nvllm user.
#
#   sudo deploy/uninstall.sh           keeps /etc/nvllm (config) and /var/lib/nvllm/models
#   sudo deploy/uninstall.sh --purge   removes those too: models, the whole state directory, the config
#
# Safe to run again, and on a machine where nvllm was never installed. Takes the same NVLLM_ROOT,
# NVLLM_VENV, NVLLM_ETC, NVLLM_STATE, NVLLM_UNIT_DIR, NVLLM_SKIP_USER and NVLLM_SKIP_SYSTEMCTL variables
# as install.sh (see there).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prog=uninstall.sh
purge=0
for arg in "$@"; do
    case "$arg" in
        --purge) purge=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "uninstall.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

# shellcheck source=paths.sh
. "$here/paths.sh"
unit="$root$NVLLM_UNIT_DIR/nvllm.service"

if [ -z "$root" ] && [ "$(id -u)" -ne 0 ]; then
    die "run as root (sudo), or set NVLLM_ROOT"
fi

# 1. Stop and disable. SIGTERM lets running requests drain (TimeoutStopSec in the unit).
if [ "${NVLLM_SKIP_SYSTEMCTL:-0}" = 1 ]; then
    say "skipping systemctl (NVLLM_SKIP_SYSTEMCTL=1)"
elif [ -n "$root" ] || [ ! -d /run/systemd/system ]; then
    # A staging root, or a system not booted with systemd: unlink it offline.
    if [ -e "$unit" ]; then systemctl --root="${root:-/}" disable nvllm.service; fi
elif systemctl cat nvllm.service >/dev/null 2>&1; then
    say "stopping and disabling nvllm"
    systemctl disable --now nvllm.service
fi

# 2. The unit.
if [ -e "$unit" ]; then
    rm -f "$unit"
    say "removed $unit"
fi
if [ "${NVLLM_SKIP_SYSTEMCTL:-0}" != 1 ] && [ -z "$root" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl reset-failed nvllm.service >/dev/null 2>&1 || true   # fails when it never failed
fi

# 3. The venv, and /opt/nvllm when nothing else is left in it.
if [ -e "$venv" ]; then
    rm -rf "$venv"
    say "removed $venv"
fi
parent="$(dirname "$venv")"
if [ "$(basename "$parent")" = nvllm ] && [ -d "$parent" ]; then
    rmdir "$parent" 2>/dev/null || say "kept $parent: it holds other files"
fi

# 4. The user (and its group, when userdel left it).
if [ "${NVLLM_SKIP_USER:-0}" = 1 ] || [ -n "$root" ]; then
    say "leaving users alone"
else
    if getent passwd "$SERVICE_USER" >/dev/null; then
        userdel "$SERVICE_USER"
        say "removed user $SERVICE_USER"
    fi
    if getent group "$SERVICE_USER" >/dev/null; then
        groupdel "$SERVICE_USER"
    fi
fi

# 5. State and config: the models and the config stay unless --purge.
if [ "$purge" = 1 ]; then
    rm -rf "$state" "$etc"
    say "purged $state and $etc"
elif [ -d "$state" ]; then
    find "$state" -mindepth 1 -maxdepth 1 ! -name models -exec rm -rf {} +
    say "kept $etc and $state/models (--purge removes them)"
fi
say "done"
