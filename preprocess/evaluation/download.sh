#!/usr/bin/env bash
# Evaluation data (STS 2012-2016, STS 2017, STS Benchmark, LASER Tatoeba) from the official sources
# into OUT (default: the folder paraphrastic-evaluate reads by default) in the layout it reads.
#   bash download.sh [OUT]
#   EVAL_LOCAL_DIR=/path/with/official/archives bash download.sh [OUT]     (no download)
# EVAL_ONLY="2016 stsb" limits the sets; DOWNLOAD_DIR sets where downloads go.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
args=(--downloads "${DOWNLOAD_DIR:-$here/downloads}")
[[ -n ${1:-} ]] && args+=(--out "$1")
[[ -n ${EVAL_LOCAL_DIR:-} ]] && args+=(--local "$EVAL_LOCAL_DIR")
# shellcheck disable=SC2206
[[ -n ${EVAL_ONLY:-} ]] && args+=(--only $EVAL_ONLY)
"${PYTHON:-python}" -m paraphrastic.preprocess.evaluation.download "${args[@]}"
