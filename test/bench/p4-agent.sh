#!/usr/bin/env bash
# P4: the agent's memory: RSS idle, and peak RSS (VmHWM) while it verifies
# and extracts a large bundle given with `ferry load`. Also the udev event
# to first byte read delay (test/udev benchmark).
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
SIZE_MIB=${P4_SIZE_MIB:-4096}
WORK=${BENCH_DIR:-/var/tmp/ferry-bench}
RESULTS=${RESULTS:-$WORK/results.jsonl}
tarfile=$(mkbig -size-mib "$SIZE_MIB" -out "$WORK")
root=$(mktemp -d "$WORK/agent.XXXX")
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$root"' EXIT
cat > "$root/config.toml" <<TOML
node_name = "bench"
[paths]
state_dir = "$root/state"
extract_dir = "$root/upgrade"
mount_dir = "$root/media"
socket = "$root/ferry.sock"
[crio]
socket = ""
[peer]
listen = ""
TOML
bin/ferry agent --config "$root/config.toml" 2>"$root/agent.log" &
pid=$!
for _ in $(seq 100); do bin/ferry status --config "$root/config.toml" >/dev/null 2>&1 && break; sleep 0.1; done
sleep 2
idle=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
bin/ferry load --config "$root/config.toml" "$tarfile" >/dev/null
deadline=$(( $(date +%s) + ${P4_TIMEOUT:-600} ))
until bin/ferry status -o json --config "$root/config.toml" | grep -q '"phase": "extracted"'; do
  if [ "$(date +%s)" -gt "$deadline" ] || ! kill -0 "$pid" 2>/dev/null; then
    echo "p4: the agent did not extract the bundle; its log:" >&2; tail -20 "$root/agent.log" >&2; exit 1
  fi
  sleep 0.2
done
peak=$(awk '/VmHWM/{print $2}' /proc/$pid/status)
row "P4 agent RSS idle" "$((idle/1024)) MiB" "" "goal <= 32 MiB"
row "P4 agent peak RSS, ${SIZE_MIB} MiB extract" "$((peak/1024)) MiB" "" "goal <= 64 MiB"
printf '{"bench":"P4","size_mib":%s,"idle_rss_kib":%s,"peak_rss_kib":%s}\n' "$SIZE_MIB" "$idle" "$peak" >> "$RESULTS"

# The same idle agent with a kubeconfig, against a real kube-apiserver.
if out=$(go test ./test/kube -run '^$' -bench AgentIdleRSSWithKubeconfig -benchtime 1x 2>&1); then
  kidle=$(echo "$out" | awk '/AgentIdleRSS/{for(i=1;i<=NF;i++) if($(i+1)=="idle-rss-MiB") printf "%.0f", $i}')
  row "P4 agent RSS idle, with a kubeconfig" "${kidle} MiB" "" "goal <= 32 MiB"
  printf '{"bench":"P4-kube","idle_rss_mib":%s}\n' "$kidle" >> "$RESULTS"
else
  echo "$out" >&2
  row "P4 agent RSS idle, with a kubeconfig" FAILED "" "go test ./test/kube -bench AgentIdleRSS failed"
fi

if ! out=$(go test ./test/udev -run '^$' -bench PlugToFirstByte -benchtime 10x 2>&1); then
  echo "$out" >&2
  row "P4 udev event to first byte read" FAILED "" "go test ./test/udev -bench PlugToFirstByte failed"
  exit 1
fi
ms=$(echo "$out" | awk '/PlugToFirstByte/{for(i=1;i<=NF;i++) if($(i+1)=="event-ms") e=$i; else if($(i+1)=="open-ms") o=$i} END{if(e!="") printf "%.0f", e+o}')
if [ -n "$ms" ]; then
  row "P4 udev event to first byte read" "${ms} ms" "" "goal <= 1000 ms"
  printf '{"bench":"P4-plug","plug_to_first_byte_ms":%s}\n' "$ms" >> "$RESULTS"
else
  echo "$out" >&2
  row "P4 udev event to first byte read" skipped "" "no PlugToFirstByte result (needs root and udev)"
fi
