#!/usr/bin/env bash
# make faults: ferry's fault campaign (test/faults, build tag "faults").
# Prints the whole `go test -v` log to $FAULTS_LOG and, at the end, one
# line per case: "kill-extract: 20/20 passed". Exits non-zero if any trial
# failed. FAULTS_RUN selects tests (a go test -run pattern);
# FAULTS_<CASE>_TRIALS sets a case's trial count; FAULTS_SEED replays the
# kill points of an earlier run.
set -uo pipefail
cd "$(dirname "$0")/../.."
export FAULTS_DIR=${FAULTS_DIR:-/var/tmp/ferry-faults}
mkdir -p "$FAULTS_DIR"
log=${FAULTS_LOG:-$FAULTS_DIR/faults-$(date +%Y%m%dT%H%M%S).log}
start=$(date +%s)
go test -tags faults,containers_image_openpgp -count=1 -v -timeout "${FAULTS_TIMEOUT:-40m}" -run "${FAULTS_RUN:-.}" ./test/faults >"$log" 2>&1
rc=$?
echo "fault campaign ($(( $(date +%s) - start ))s; log: $log)"
grep -E '^[a-z0-9-]+: [0-9]+/[0-9]+ passed' "$log" || echo "no case reported: see the log"
if [ $rc -ne 0 ]; then
  echo "FAILED:"
  grep -E -- '--- FAIL|FAILED after' "$log" | awk '!seen[$0]++' | head -40
fi
exit $rc
