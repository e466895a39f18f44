#!/usr/bin/env bash
# Puts a local tokenizer folder into a Hugging Face cache, so that clients which resolve
# tokenizers through the Hub's cache find it with no network: AIPerf 0.13.0 with
# HF_HUB_OFFLINE=1, and AIPerf's decode workers, which set HF_HUB_OFFLINE=1 themselves.
#
# Why: offline, AIPerf looks every --tokenizer up with snapshot_download(name,
# local_files_only=True), a local path included, so `--tokenizer ./assets/tokenizers/qwen3`
# fails (HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name').
# A repo id that the cache holds (`--tokenizer local/qwen3`, with HF_HOME pointing at that
# cache) loads the same files.
#
# usage: tools/hf_cache_tokenizer.sh [TOKENIZER_DIR] [HF_HOME] [REPO_ID]
#   TOKENIZER_DIR  a folder with tokenizer.json (+ tokenizer_config.json), default the shipped
#                  Qwen3 tokenizer, assets/tokenizers/qwen3
#   HF_HOME        the cache's root, default ${XDG_CACHE_HOME:-$HOME/.cache}/kvbust/hf
#   REPO_ID        the name to give it, default local/<the folder's name>
# Prints the two settings to use. Running it again refreshes the copy.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="${1:-$root/assets/tokenizers/qwen3}"
home="${2:-${XDG_CACHE_HOME:-$HOME/.cache}/kvbust/hf}"
repo="${3:-local/$(basename "$src")}"

[ -f "$src/tokenizer.json" ] || { echo "hf_cache_tokenizer.sh: $src has no tokenizer.json" >&2; exit 2; }
case "$repo" in
    */*/* | /* | */ | *" "*) echo "hf_cache_tokenizer.sh: REPO_ID must be NAMESPACE/NAME, got $repo" >&2; exit 2 ;;
    */*) ;;
    *) echo "hf_cache_tokenizer.sh: REPO_ID must be NAMESPACE/NAME, got $repo" >&2; exit 2 ;;
esac

# The Hub cache's layout: hub/models--NAMESPACE--NAME/refs/main holds a commit id, and
# snapshots/<commit>/ the files. The id is the tokenizer's own digest, so the same files always
# land in the same snapshot.
commit="$(cat "$src"/tokenizer*.json | sha1sum | cut -c1-40)"
dir="$home/hub/models--${repo/\//--}"
mkdir -p "$dir/refs" "$dir/snapshots/$commit"
for f in "$src"/*.json; do
    cp "$f" "$dir/snapshots/$commit/"
done
printf '%s' "$commit" >"$dir/refs/main"
echo "export HF_HOME=$home"
echo "--tokenizer $repo"
