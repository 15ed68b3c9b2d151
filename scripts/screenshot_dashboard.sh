#!/usr/bin/env bash
# Screenshot of LoadGuard's TensorBoard dashboard (the Custom Scalars tab), for the README and the docs.
#
# Usage: scripts/screenshot_dashboard.sh [LOGDIR] [OUT.png]
#   LOGDIR   TensorBoard logs with loadguard/* metrics; default: a fresh `loadguard demo --auto-tune` run.
#   OUT.png  where to save the picture; default: docs/dashboard.png.
#
# Needs: the `loadguard` and `tensorboard` programs (pip install -e .) and headless Chromium
# (Debian/Ubuntu: apt-get install -y chromium). TensorBoard listens on 127.0.0.1 only and is stopped on exit.
# Environment: PORT (default: a free port), WINDOW (default 1300,760), RENDER_MS (default 15000: the virtual
# time Chromium gives the page to load its data and draw the charts before the picture is taken). The page
# opens without smoothing and without ignoring outliers, so a jump (the tuner's switch) shows at full height.
set -euo pipefail
cd "$(dirname "$0")/.."

out="${2:-docs/dashboard.png}"
window="${WINDOW:-1300,760}"
render_ms="${RENDER_MS:-15000}"
work="$(mktemp -d)"
tb_pid=""
cleanup() {
  if [[ -n "$tb_pid" ]]; then kill "$tb_pid" 2>/dev/null || true; wait "$tb_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [[ -z "$browser" ]]; then
  echo "error: no headless Chromium found; install it (Debian/Ubuntu: apt-get install -y chromium)" >&2
  exit 1
fi

logdir="${1:-}"
if [[ -z "$logdir" ]]; then
  logdir="$work/logs"
  echo "No LOGDIR given: recording one with 'loadguard demo --auto-tune' ..."
  loadguard demo --auto-tune --no-progress --logdir "$logdir" >"$work/demo.log" 2>&1 || { cat "$work/demo.log" >&2; exit 1; }
fi
[[ -d "$logdir" ]] || { echo "error: $logdir is not a directory" >&2; exit 1; }

port="${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
tensorboard --logdir "$logdir" --host 127.0.0.1 --port "$port" --load_fast false >"$work/tensorboard.log" 2>&1 &
tb_pid=$!

# Ready once the server lists loadguard scalars (its first pass over the logs has finished).
for _ in $(seq 1 120); do
  if python3 - "$port" <<'PY' 2>/dev/null; then break; fi
import json, sys, urllib.request
tags = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/data/plugin/scalars/tags", timeout=2))
sys.exit(0 if any(t.startswith("loadguard/") for run in tags.values() for t in run) else 1)
PY
  if ! kill -0 "$tb_pid" 2>/dev/null; then cat "$work/tensorboard.log" >&2; exit 1; fi
  sleep 0.5
done

mkdir -p "$(dirname "$out")"
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars \
  --user-data-dir="$work/chromium" --window-size="$window" --virtual-time-budget="$render_ms" \
  --screenshot="$(realpath -m "$out")" "http://127.0.0.1:$port/#custom_scalars&_smoothingWeight=0&_ignoreYOutliers=false" >"$work/chromium.log" 2>&1 \
  || { cat "$work/chromium.log" >&2; exit 1; }
echo "saved $out"
