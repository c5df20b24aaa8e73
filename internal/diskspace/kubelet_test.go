package diskspace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadKubeletLimits(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       Limits
		bad        bool
	}{
		{"absent", "", DefaultLimits, false},
		{"yaml, percent", "kind: KubeletConfiguration\nimageGCHighThresholdPercent: 80\nevictionHard:\n  imagefs.available: 10%\n  memory.available: 100Mi\n",
			Limits{EvictBelowPercent: 10, GCHighPercent: 80}, false},
		{"json, quantity", `{"kind":"KubeletConfiguration","evictionHard":{"imagefs.available":"5Gi"}}`,
			Limits{EvictBelowBytes: 5 << 30, GCHighPercent: 85}, false},
		{"neither set", "kind: KubeletConfiguration\nmaxPods: 250\n", DefaultLimits, false},
		{"not a percentage", "imageGCHighThresholdPercent: 150\n", DefaultLimits, true},
		{"not a quantity", "evictionHard:\n  imagefs.available: lots\n", DefaultLimits, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "kubelet.conf")
			if tc.file != "" {
				if err := os.WriteFile(p, []byte(tc.file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ReadKubeletLimits(p)
			if (err != nil) != tc.bad {
				t.Fatalf("err %v", err)
			}
			if !tc.bad && got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestHeadroom_TheNearerThresholdBinds(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name        string
		l           Limits
		total, free int64
		room        int64
		why         string
	}{
		{"image GC binds", Limits{EvictBelowPercent: 10, GCHighPercent: 80}, 100 * gib, 40 * gib, 20 * gib, "80%"}, // 80 - 60 used
		{"eviction binds", Limits{EvictBelowPercent: 30, GCHighPercent: 95}, 100 * gib, 40 * gib, 10 * gib, "30%"}, // 40 - 30
		{"absolute eviction", Limits{EvictBelowBytes: 35 * gib, GCHighPercent: 95}, 100 * gib, 40 * gib, 5 * gib, "35 GiB"},
		{"already over", DefaultLimits, 100 * gib, 10 * gib, 0, "the kubelet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			room, why := tc.l.Headroom(tc.total, tc.free)
			if room != tc.room || !strings.Contains(why, tc.why) {
				t.Fatalf("room %s (%s), want %s (%s)", Human(room), why, Human(tc.room), tc.why)
			}
		})
	}
}
