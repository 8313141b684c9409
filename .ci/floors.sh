#!/usr/bin/env bash
# The floors tier (issue 50): the Hugging Face, export, import, padding, beam search, lm-eval and figure tests in
# venvs of their own, made here from pyproject.toml:
#   floors  the lowest versions the requirements allow together (uv's lowest-direct resolution of the
#           dev extra, numpy held to its declared 1.24.x, which uv's resolution would lift to 2.0 for
#           newer transitive packages), so a floor that no longer works fails here;
#   hf4     the newest versions the dev and hf4 extras allow together: transformers < 5 (the last 4.x) with
#           the datasets and huggingface-hub releases that go with it (pyproject.toml, docs/setup.md).
# torch stays at the CPU build 2.13.0 that pip takes from this machine's disk in both: PyPI's Linux
# x86_64 wheels of torch 2.9 (the declared floor) are CUDA builds of several GB (docs/setup.md).
# Usage: bash .ci/floors.sh [floors|hf4 ...] (default both); FLOORS_DIR keeps the venvs (default: a
# temporary folder, removed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- floors hf4
work=${FLOORS_DIR:-$(mktemp -d)}
[ -n "${FLOORS_DIR:-}" ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
TORCH=2.13.0+cpu
TESTS=(tests/interop/test_hf.py tests/interop/test_retrofitting.py tests/interop/test_exports.py
       tests/interop/test_import_hf.py tests/interop/test_hf_model.py tests/interop/test_hf_padding.py
       tests/interop/test_hf_surface.py tests/interop/test_hf_beam_search.py tests/interop/test_model_folders.py
       tests/runtime/test_beam_search.py tests/model/test_masking.py tests/eval/test_eval.py
       tests/data/test_snapshot.py tests/data/test_sources.py tests/data/test_config.py tests/data/test_tokenizer.py
       tests/data/test_cache_entry.py tests/data/test_batches.py
       tests/test_plot.py tests/report/test_relative_loss_figure.py tests/analysis/test_analysis.py)

# the folder that holds the CPU build of torch (pip's find-links here), so that nothing downloads one
wheels=""
for dir in ${PIP_FIND_LINKS:-} $(python -m pip config get global.find-links 2>/dev/null || true) /opt/wheels; do
    if compgen -G "$dir/torch-$TORCH-*.whl" >/dev/null; then wheels=$dir; break; fi
done
if [ -z "$wheels" ]; then
    echo "floors tier: no torch-$TORCH wheel on this machine (pip's find-links); not downloading a CUDA build" >&2
    exit 1
fi

[ -x "$work/uv/bin/uv" ] || { python -m venv "$work/uv" && "$work/uv/bin/pip" install --quiet "uv==0.13.9"; }
uv=$work/uv/bin/uv
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

for config in "$@"; do
    start=$SECONDS
    venv=$work/$config
    case $config in
        # pyarrow 26 (datasets') needs NumPy 2 at import and does not say so: older ones serve numpy 1.24
        floors) printf 'torch==%s\nnumpy<1.25\npyarrow<26\n' "$TORCH" > "$work/$config.constraints"
                resolution=lowest-direct extras=(--extra dev) ;;
        hf4) printf 'torch==%s\n' "$TORCH" > "$work/$config.constraints"
             resolution=highest extras=(--extra dev --extra hf4) ;;
        *) echo "floors tier: unknown configuration $config (floors, hf4)" >&2; exit 2 ;;
    esac
    "$uv" pip compile --quiet pyproject.toml "${extras[@]}" --resolution "$resolution" \
        --python-version "$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
        --find-links "$wheels" -c "$work/$config.constraints" -o "$work/$config.txt"
    rm -rf "$venv" && python -m venv "$venv"
    "$uv" pip sync --quiet --python "$venv/bin/python" --find-links "$wheels" "$work/$config.txt"
    "$uv" pip install --quiet --python "$venv/bin/python" --no-deps -e .
    "$uv" pip check --python "$venv/bin/python"  # the set installed is consistent, as pip check sees it
    "$venv/bin/python" .ci/floors_versions.py
    installed=$((SECONDS - start))
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}"
    echo "floors tier, $config: install ${installed} s, install + tests $((SECONDS - start)) s"
done
