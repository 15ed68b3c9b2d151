#!/usr/bin/env bash
# Runs Lightning's own tests with LoadGuard appended to every Trainer, reruns the failures without it, and
# prints the tests that fail only with LoadGuard.
#
#   scripts/lightning_suite.sh PATH [PYTEST_ARGS...]
#
# PATH is a checkout of Lightning's tests: the folder holding `tests_pytorch` (Lightning's `tests/`) or
# `tests_pytorch` itself. Lightning's test requirements must be importable (`requirements/pytorch/test.txt`;
# `cloudpickle` is the one most subsets need). PYTEST_ARGS replace the default subset below.
#
# Environment: LOADGUARD_AUTO_TUNE=1 injects LoadGuard(auto_tune=True); LOADGUARD_SUITE_OUT=DIR keeps the logs
# there (default: a new temporary folder); LOADGUARD_SUITE_TIMEOUT caps each pytest run in seconds (default 7200).
set -u

if [ $# -lt 1 ]; then
    sed -n '2,14p' "$0"
    exit 2
fi
tests=$(cd "$1" && pwd) || exit 2
shift
if [ -d "$tests/tests_pytorch" ]; then
    root=$tests
elif [ "$(basename "$tests")" = tests_pytorch ]; then
    root=$(dirname "$tests")
else
    echo "lightning_suite.sh: $tests holds no tests_pytorch folder" >&2
    exit 2
fi

if [ $# -gt 0 ]; then
    subset=("$@")
else
    subset=(
        tests_pytorch/loops
        tests_pytorch/trainer/test_dataloaders.py
        tests_pytorch/trainer/connectors
        tests_pytorch/checkpointing --ignore=tests_pytorch/checkpointing/test_legacy_checkpoints.py
        tests_pytorch/callbacks
        tests_pytorch/models/test_restore.py
        tests_pytorch/models/test_hooks.py
    )
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$repo/scripts:$repo${PYTHONPATH:+:$PYTHONPATH}"
out=${LOADGUARD_SUITE_OUT:-$(mktemp -d -t lightning_suite.XXXXXX)}
mkdir -p "$out"
limit=${LOADGUARD_SUITE_TIMEOUT:-7200}
py=${PYTHON:-python}

# --rootdir: node ids relative to $root, where the reruns start, even where the pytest configuration lies above it
# (Lightning's pyproject.toml, one folder above tests/).
run() {  # run NAME INJECT ARGS...: one pytest run; failed node ids go to $out/NAME.failed
    local name=$1 inject=$2
    shift 2
    : > "$out/$name.failed"
    (cd "$root" && LOADGUARD_INJECT=$inject LOADGUARD_FAILURES_FILE="$out/$name.failed" \
        timeout "$limit" "$py" -m pytest -q -rfE --rootdir "$root" -p loadguard_inject -p no:cacheprovider "$@") > "$out/$name.log" 2>&1
    local rc=$?
    sort -u -o "$out/$name.failed" "$out/$name.failed"
    echo "$name: $(tail -n 1 "$out/$name.log") (exit $rc; log $out/$name.log)"
    # 1 means failed tests, and those are listed; anything else (124: cut by the timeout; 2-5: interrupted,
    # internal or usage error, nothing collected) means the run did not complete.
    if [ $rc -ne 0 ] && { [ $rc -ne 1 ] || [ ! -s "$out/$name.failed" ]; }; then
        echo "lightning_suite.sh: the $name run did not complete (exit $rc); see its log" >&2
        exit 2
    fi
}

run with_loadguard 1 "${subset[@]}"
readarray -t failed < "$out/with_loadguard.failed"
if [ ${#failed[@]} -eq 0 ]; then
    echo "no test failed with LoadGuard"
    exit 0
fi
run without_loadguard 0 "${failed[@]}"
comm -23 "$out/with_loadguard.failed" "$out/without_loadguard.failed" > "$out/only_with.txt"
readarray -t only < "$out/only_with.txt"
if [ ${#only[@]} -eq 0 ]; then
    echo "every test that failed with LoadGuard also fails without it (${#failed[@]})"
    exit 0
fi
# Once more with LoadGuard: a test that passes now failed by chance (a timing-sensitive test on a busy host).
run again_with_loadguard 1 "${only[@]}"
comm -12 "$out/only_with.txt" "$out/again_with_loadguard.failed" > "$out/injected_only.txt"
comm -23 "$out/only_with.txt" "$out/again_with_loadguard.failed" > "$out/flaky.txt"
echo
echo "failed with LoadGuard: ${#failed[@]}; also without it: $(wc -l < "$out/without_loadguard.failed");" \
    "only with it, twice: $(wc -l < "$out/injected_only.txt"); only with it once (flaky): $(wc -l < "$out/flaky.txt")"
if [ -s "$out/injected_only.txt" ]; then
    echo "tests that fail only with LoadGuard:"
    sed 's/^/  /' "$out/injected_only.txt"
fi
if [ -s "$out/flaky.txt" ]; then
    echo "failed once with LoadGuard, then passed with it:"
    sed 's/^/  /' "$out/flaky.txt"
fi
[ -s "$out/injected_only.txt" ] && exit 1
exit 0
