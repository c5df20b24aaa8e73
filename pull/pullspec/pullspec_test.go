package pullspec

import (
	"testing"
	"time"
)

// The lines a pull's status is said in, one per state, as ferry status
// and the UpgradeBundle show them.
func TestStatus_Lines(t *testing.T) {
	rel := "quay.io/openshift-release-dev/ocp-release@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	next := time.Date(2026, 1, 2, 22, 0, 5, 0, time.Local)
	for _, tc := range []struct {
		s            Status
		line, coarse string
	}{
		{Status{State: StateWaiting, Release: rel, Window: "22:00-06:00", NextTry: next},
			"pulling quay.io/openshift-release-dev/ocp-release@sha256:0123456789ab… from the registry: waiting for the window 22:00-06:00 (opens 22:00)", ""},
		{Status{State: StateFetching, Release: rel, Images: 3, Total: 183, From: "worker-1"},
			"pulling quay.io/openshift-release-dev/ocp-release@sha256:0123456789ab… from node worker-1: resolving 3/183 images", ""},
		{Status{State: StateFetching, Release: "r", Bytes: 6_700_000_000, ToFetch: 16 << 30, Rate: 2 << 20, ETA: 90 * time.Second},
			"pulling r from the registry: 6.2 GiB of 16 GiB over the link at 2 MiB/s, about 1m30s left",
			"pulling r from the registry: 38% of 16 GiB over the link, about 2m0s left"},
		{Status{State: StateRetrying, Release: "r", Attempts: 3, NextTry: next, Error: "EOF"},
			"pulling r from the registry: failed 3 times, next try 22:00:05: EOF",
			"pulling r from the registry: failed 3 times: EOF"},
		{Status{State: StateHanding, Release: "r"}, "pulled r from the registry: verifying and extracting it", ""},
		{Status{State: StateDone, Release: "r"}, "pulled r from the registry", ""},
		{Status{State: StateFailed, Release: "r", Error: "no such tag"}, "pulling r from the registry failed: no such tag", ""},
	} {
		if got := tc.s.Line(); got != tc.line {
			t.Errorf("Line of %s:\n got %s\nwant %s", tc.s.State, got, tc.line)
		}
		if tc.coarse == "" {
			tc.coarse = tc.line
		}
		if got := tc.s.Coarse(); got != tc.coarse {
			t.Errorf("Coarse of %s:\n got %s\nwant %s", tc.s.State, got, tc.coarse)
		}
	}
}

func TestWindow_ParseAndString(t *testing.T) {
	w, err := ParseWindow(" 22:00-06:05 ")
	if err != nil || w.String() != "22:00-06:05" {
		t.Errorf("ParseWindow: %v, %v", w, err)
	}
	if w, _ := ParseWindow(""); w.String() != "always" {
		t.Errorf("empty window: %v", w)
	}
	for in, says := range map[string]string{
		"22:00":       `window "22:00": want HH:MM-HH:MM, e.g. 22:00-06:00`,
		"25:00-06:00": `window "25:00-06:00": "25:00" is not a time of day (HH:MM)`,
		"06:00-06:00": `window "06:00-06:00": it starts when it ends: leave it empty for always`,
	} {
		if _, err := ParseWindow(in); err == nil || err.Error() != says {
			t.Errorf("ParseWindow(%q) = %v, want %s", in, err, says)
		}
	}
}
