#!/usr/bin/env bash
# Screenshot of LoadGuard's TensorBoard dashboard (the Custom Scalars tab), for the README and the docs.
#
# Usage: scripts/screenshot_dashboard.sh [LOGDIR] [OUT.png]
#   LOGDIR   TensorBoard logs with loadguard/* metrics; default: a fresh `loadguard demo --auto-tune` run.
#   OUT.png  where to save the picture; default: docs/dashboard.png.
#
# Needs: the `loadguard` and `tensorboard` programs (pip install -e .), headless Chromium and its driver
# (Debian/Ubuntu: apt-get install -y chromium chromium-driver) and selenium (pip install selenium). TensorBoard
# listens on 127.0.0.1 only and is stopped on exit.
# Environment: PORT (default: a free port), WINDOW (default 1300,900), RENDER_S (default 15: the time the page gets
# to load its data and draw the charts before the picture is taken). The page opens without smoothing and without
# ignoring outliers (TensorBoard keeps that choice in the browser's local storage, so the script sets it there and
# reloads), so a jump (the tuner's switch) shows at full height.
set -euo pipefail
cd "$(dirname "$0")/.."

out="${2:-docs/dashboard.png}"
window="${WINDOW:-1300,900}"
render_s="${RENDER_S:-15}"
work="$(mktemp -d)"
tb_pid=""
cleanup() {
  if [[ -n "$tb_pid" ]]; then kill "$tb_pid" 2>/dev/null || true; wait "$tb_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
driver="$(command -v chromedriver || true)"
if [[ -z "$browser" || -z "$driver" ]] || ! python3 -c "import selenium" 2>/dev/null; then
  echo "error: needs headless Chromium, chromedriver and selenium" \
    "(Debian/Ubuntu: apt-get install -y chromium chromium-driver; pip install selenium)" >&2
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
python3 - "$browser" "$driver" "$port" "$window" "$render_s" "$(realpath -m "$out")" <<'PY'
import sys, time
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

browser, driver_path, port, window, render_s, out = sys.argv[1:]
options = webdriver.ChromeOptions()
options.binary_location = browser
for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={window}"):
    options.add_argument(flag)
driver = webdriver.Chrome(service=Service(driver_path), options=options)
try:
    driver.set_window_size(*(int(v) for v in window.split(",")))
    url = f"http://127.0.0.1:{port}/#custom_scalars&_smoothingWeight=0"
    driver.get(url)
    driver.execute_script("window.localStorage.setItem('_ignoreYOutliers', 'false')")
    driver.get(url)
    driver.refresh()
    time.sleep(float(render_s))
    driver.save_screenshot(out)
finally:
    driver.quit()
PY
echo "saved $out"
