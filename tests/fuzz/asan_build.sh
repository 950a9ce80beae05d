#!/usr/bin/env bash
# The C twins (cbcl/_native_src/: encoders.c, canonical text and binary frames; scanner.c, the
# text reader; speedups.c, the binary decoder) under AddressSanitizer and UBSan: builds
# the extension cbcl._native with -fsanitize=address,undefined (and warnings as errors) into a
# temporary copy of the package, then runs against it the differential tests
# (tests/test_encoders.py, test_scanner.py, test_reader_tiers.py, test_decoder_atoms.py,
# test_envelope_walk.py, test_automaton.py, test_schema.py, test_accept_document.py,
# test_decode_frame.py, test_entries.py, test_decimals_in_place.py, test_native_state.py,
# test_native_fields.py, test_message_api.py and the
# canonical, reader and
# codec suites that go through them) and the fuzz harnesses
# tests/fuzz/fuzz_encoders.py and tests/fuzz/fuzz_scanner.py: under libFuzzer (atheris)
# when it is installed, and on random inputs as well; with atheris, also the decoder and
# body targets of tests/fuzz/fuzz_cbcl.py. Any sanitizer report aborts the run
# (halt_on_error).
#
#     tests/fuzz/asan_build.sh [SECONDS]     # fuzzing time per harness, 60 by default
#
# Environment: PYTHON (default .venv/bin/python), CC (default gcc; the sanitizer runtimes
# are that compiler's, preloaded into the interpreter, which is not built with them).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
PY=${PYTHON:-.venv/bin/python}
case "$PY" in /*) ;; */*) PY="$root/$PY" ;; esac  # (the runs below are not in $root)
CC=${CC:-gcc}
SECONDS_TO_FUZZ=${1:-60}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/pkg" "$work/corpus"
cp -r cbcl "$work/pkg/cbcl"
rm -rf "$work/pkg/cbcl/__pycache__" "$work/pkg/cbcl"/*.so "$work/pkg/cbcl"/*.pyd

include=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
target="$work/pkg/cbcl/_native$suffix"
echo "+ $CC -fsanitize=address,undefined … cbcl/_native_src/*.c -> $target"
"$CC" -shared -fPIC -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
    -fno-sanitize-recover=all -Wall -Wextra -Werror -I"$include" cbcl/_native_src/module.c \
    cbcl/_native_src/scanner.c cbcl/_native_src/speedups.c cbcl/_native_src/encoders.c -o "$target"

LD_PRELOAD="$("$CC" -print-file-name=libasan.so) $("$CC" -print-file-name=libubsan.so)"
export LD_PRELOAD
# Leaks are not checked: the interpreter keeps memory until exit by design. PYTHONMALLOC:
# every PyMem allocation goes through malloc, so ASan sees the extension's buffers.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONMALLOC=malloc
export PYTHONPATH="$work/pkg"
export CBCL_REQUIRE_SPEEDUPS=1  # a skip for want of the extension would hide nothing
cd "$work"  # not the checkout: its cbcl/ would come first on sys.path
ln -s "$root/descriptors" descriptors  # (what `cbcl bench`'s corpus, used by a test, finds)

"$PY" -c "import sys, cbcl._native as m
assert m.__file__.startswith(sys.argv[1]), m.__file__
print('+ sanitized build:', m.__file__)" "$work/pkg"
echo "+ pytest (differential tests) against the sanitized builds"
"$PY" -m pytest -q -p no:cacheprovider "$root/tests/test_encoders.py" \
    "$root/tests/test_canonical.py" "$root/tests/test_codec.py" \
    "$root/tests/test_scanner.py" "$root/tests/test_reader_tiers.py" \
    "$root/tests/test_reader.py" "$root/tests/test_decoder_atoms.py" \
    "$root/tests/test_envelope_walk.py" "$root/tests/test_automaton.py" \
    "$root/tests/test_schema.py" "$root/tests/test_accept_document.py" \
    "$root/tests/test_decode_frame.py" "$root/tests/test_entries.py" \
    "$root/tests/test_decimals_in_place.py" "$root/tests/test_native_state.py" \
    "$root/tests/test_native_fields.py" "$root/tests/test_message_api.py"
for harness in encoders scanner; do
    echo "+ fuzz_$harness.py on random inputs"
    "$PY" "$root/tests/fuzz/fuzz_$harness.py" --random 20000
done
if "$PY" -c "import atheris" 2>/dev/null; then
    for harness in encoders:encoders scanner:reader; do
        name=${harness%%:*} seeds=${harness#*:}
        mkdir -p "$work/corpus/$name"
        echo "+ fuzz_$name.py under libFuzzer for ${SECONDS_TO_FUZZ}s"
        "$PY" "$root/tests/fuzz/fuzz_$name.py" -max_total_time="$SECONDS_TO_FUZZ" \
            -rss_limit_mb=0 "$work/corpus/$name" "$root/tests/fuzz/corpus/$seeds"
    done
    # the whole-frame decoder and parse's C path, each against its Python twin
    for target in decoder body; do
        mkdir -p "$work/corpus/cbcl-$target"
        echo "+ fuzz_cbcl.py $target under libFuzzer for ${SECONDS_TO_FUZZ}s"
        "$PY" "$root/tests/fuzz/fuzz_cbcl.py" "$target" -max_total_time="$SECONDS_TO_FUZZ" \
            -rss_limit_mb=0 "$work/corpus/cbcl-$target" "$root/tests/fuzz/corpus/$target"
    done
fi
echo "+ no sanitizer findings"
