#!/usr/bin/env bash
# Builds and runs kolo's coverage-guided fuzz targets (cargo-fuzz + libFuzzer; docs/fuzzing.md).
#
#   dev/fuzz.sh build                  build every target
#   dev/fuzz.sh list                   list the targets
#   dev/fuzz.sh TARGET|all [SECONDS]   run one target, or each in turn, for SECONDS (default 60)
#
# Environment: FUZZ_SANITIZER (address, the default; `none` where ASan does not work),
# FUZZ_TOOLCHAIN (nightly), FUZZ_ARGS (extra libFuzzer flags, e.g. "-jobs=2 -workers=2").
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Never run by CI.
# Each run grows corpus/TARGET (only the committed seed-* files are tracked), writes crashes to
# artifacts/TARGET/ and its log, ending with libFuzzer's final stats, to artifacts/TARGET.log.
set -euo pipefail
cd "$(dirname "$0")/.."

toolchain=${FUZZ_TOOLCHAIN:-nightly}
sanitizer=${FUZZ_SANITIZER:-address}

# target -> the fuzz crate that holds it
declare -A crate_of=(
  [frame]=collective/fuzz
  [descriptor]=collective/fuzz
  [cycle_message]=collective/fuzz
  [store_path]=store/fuzz
)
targets=(frame descriptor cycle_message store_path)

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

build() {
  for dir in collective/fuzz store/fuzz; do
    echo "== building the fuzz targets in $dir (sanitizer: $sanitizer)"
    cargo "+$toolchain" fuzz build --fuzz-dir "$dir" -s "$sanitizer"
  done
}

run() {
  local target=$1 seconds=$2 dir=${crate_of[$1]}
  mkdir -p "$dir/artifacts/$target"
  echo "== fuzzing $target for $seconds s (log: $dir/artifacts/$target.log)"
  local status
  set +e
  # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
  cargo "+$toolchain" fuzz run --fuzz-dir "$dir" -s "$sanitizer" "$target" \
    -- -max_total_time="$seconds" -print_final_stats=1 ${FUZZ_ARGS:-} 2>&1 |
    tee "$dir/artifacts/$target.log" |
    grep -E '^(stat::|INFO: Seed|#[0-9]+\s+DONE|==[0-9]+==|SUMMARY|Done|thread .* panicked)'
  status=${PIPESTATUS[0]}
  set -e
  return "$status"
}

case "${1:-}" in
  build) build ;;
  list) printf '%s\n' "${targets[@]}" ;;
  all)
    for target in "${targets[@]}"; do run "$target" "${2:-60}"; done ;;
  frame | descriptor | cycle_message | store_path) run "$1" "${2:-60}" ;;
  *) usage ;;
esac
