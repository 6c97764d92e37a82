# Shared setup of the do_all.sh pipelines, sourced after they set `here` (their folder) and
# `default_out`: repo paths, settings from the environment, and `step` (one paraphrastic.preprocess.steps call).
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-python}
out=${OUT_DIR:-$default_out}
downloads=${DOWNLOAD_DIR:-$PWD/downloads}
force=()
[[ ${FORCE:-0} == 1 ]] && force=(--force)
workers=()
[[ -n ${WORKERS:-} ]] && workers=(--workers "$WORKERS")
mkdir -p "$out" "$downloads"
stats=$out/stats.json
step() { "$py" -m paraphrastic.preprocess.steps "$@" --stats "$stats" "${force[@]}"; }
