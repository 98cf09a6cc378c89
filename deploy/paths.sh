# Sourced by install.sh and uninstall.sh (not run): the install paths, their checks and messages.
# The caller sets $prog to its own name first.

NVLLM_ROOT="${NVLLM_ROOT:-/}"
NVLLM_VENV="${NVLLM_VENV:-/opt/nvllm/venv}"
NVLLM_ETC="${NVLLM_ETC:-/etc/nvllm}"
NVLLM_STATE="${NVLLM_STATE:-/var/lib/nvllm}"
NVLLM_UNIT_DIR="${NVLLM_UNIT_DIR:-/etc/systemd/system}"
SERVICE_USER=nvllm

say() { echo "$prog: $*"; }
die() { echo "$prog: error: $*" >&2; exit 1; }

# Paths go into the unit file and into rm -rf in uninstall.sh: absolute, plain characters, not "/".
check_path() {
    case "$2" in
        /?*) ;;
        *) die "$1 must be an absolute path other than /, got '$2'" ;;
    esac
    [[ "$2" =~ ^[A-Za-z0-9._/+-]+$ ]] || die "$1 may hold only letters, digits and ._/+-, got '$2'"
}
check_path NVLLM_VENV "$NVLLM_VENV"
check_path NVLLM_ETC "$NVLLM_ETC"
check_path NVLLM_STATE "$NVLLM_STATE"
check_path NVLLM_UNIT_DIR "$NVLLM_UNIT_DIR"
[ "$NVLLM_ROOT" = / ] || check_path NVLLM_ROOT "$NVLLM_ROOT"

root="${NVLLM_ROOT%/}"          # "" for the live system
venv="$root$NVLLM_VENV"
etc="$root$NVLLM_ETC"
state="$root$NVLLM_STATE"
