#!/usr/bin/env bash
# The peers tools/speech_side_by_side.py sets nvllm's speech-to-text beside, built and installed OUTSIDE the
# repository (nothing of theirs is committed):
#
#     tools/speech_peers_setup.sh DIR WHISPER_CPP_SRC CT2_FOLDER [-j N]
#
#   DIR              where everything goes: DIR/whisper.cpp-build (whisper-cli, whisper-bench), DIR/fwvenv
#                    (faster-whisper in a venv of its own), DIR/ggml-NAME-f16.bin (whisper.cpp's file of the
#                    same weights as CT2_FOLDER, NAME its folder's name)
#   WHISPER_CPP_SRC  whisper.cpp's sources, e.g. the whisper.cpp folder of pywhispercpp 1.5.1's source
#                    distribution (which also holds samples/jfk.wav)
#   CT2_FOLDER       the CTranslate2 Whisper folder the side-by-side compares on (faster-whisper loads it as
#                    it is; whisper.cpp gets it written as a ggml f16 .bin by tools/speech_ggml_of_ct2.py)
#   -j N             build jobs (default 2: the development VM has two cores)
#
# Each step is skipped when its result is already there, so running it again is cheap.
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
DIR=$(realpath -m "$1")
SRC=$(realpath "$2")
CT2=$(realpath "$3")
JOBS=2
if [ "${4:-}" = "-j" ]; then JOBS=${5:?-j takes a number}; fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
NVLLM_PY=${NVLLM_PY:-$REPO/.venv/bin/python}
mkdir -p "$DIR"

[ -f "$SRC/CMakeLists.txt" ] || { echo "speech_peers_setup: $SRC is not whisper.cpp's sources" >&2; exit 2; }
[ -f "$CT2/model.bin" ] || { echo "speech_peers_setup: $CT2 holds no model.bin (a CTranslate2 folder)" >&2; exit 2; }

# whisper.cpp: CPU only, tuned to this CPU (GGML_NATIVE: AVX2/AVX-512 as the machine has them), its own
# OpenMP threads; only the two programs the comparison runs.
BUILD=$DIR/whisper.cpp-build
if [ ! -x "$BUILD/bin/whisper-cli" ] || [ ! -x "$BUILD/bin/whisper-bench" ]; then
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
        -DWHISPER_BUILD_TESTS=OFF -DWHISPER_BUILD_SERVER=OFF -DWHISPER_SDL2=OFF -DWHISPER_CURL=OFF >/dev/null
    cmake --build "$BUILD" -j "$JOBS" --target whisper-cli whisper-bench
fi
echo "whisper.cpp: $BUILD/bin/whisper-cli, $BUILD/bin/whisper-bench"

# faster-whisper: the package as users install it, in a venv of its own so that its CTranslate2 and
# onnxruntime never meet nvllm's environment.
FW=$DIR/fwvenv
if ! "$FW/bin/python" -c "import faster_whisper" 2>/dev/null; then
    python3 -m venv "$FW"
    "$FW/bin/pip" install -q faster-whisper
fi
echo "faster-whisper: $FW/bin/python ($("$FW/bin/python" -c 'import faster_whisper, ctranslate2; print("faster-whisper", faster_whisper.__version__, "ctranslate2", ctranslate2.__version__)'))"

# The same weights for whisper.cpp: the CTranslate2 folder written as a ggml f16 file.
GGML=$DIR/ggml-$(basename "$CT2")-f16.bin
if [ ! -s "$GGML" ]; then
    "$NVLLM_PY" "$REPO/tools/speech_ggml_of_ct2.py" "$CT2" "$GGML"
fi
echo "ggml: $GGML"
