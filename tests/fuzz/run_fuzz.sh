#!/bin/sh
# Runs one fuzz target for a bounded time (PE_FUZZ_SECONDS, default 15) from its seed corpus.
# Skips (77) when the targets were not built (no clang++ with libFuzzer).
target=$(basename "$1" .test)
[ -x "./$target" ] || { echo "SKIP: $target not built (configure found no clang++ with -fsanitize=fuzzer)"; exit 77; }
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
cp "$srcdir/corpus/${target#fuzz_}"/* "$work"/ 2>/dev/null
exec "./$target" -max_total_time="${PE_FUZZ_SECONDS:-15}" -timeout=5 -rss_limit_mb=2048 \
  -print_final_stats=1 "$work"
