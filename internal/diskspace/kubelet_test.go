package diskspace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The kubelet's thresholds read from its config, YAML or JSON, percent or
// quantity; what it leaves out, or cannot be read, keeps the default.
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
		{"json, as OpenShift writes it", `{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1","evictionHard":{"imagefs.available":"15%","imagefs.inodesFree":"5%","memory.available":"100Mi","nodefs.available":"10%","nodefs.inodesFree":"4%"},"imageGCHighThresholdPercent":85,"imageGCLowThresholdPercent":80}`,
			DefaultLimits, false},
		{"decimal quantity", "evictionHard:\n  imagefs.available: 2G\n", Limits{EvictBelowBytes: 2e9, GCHighPercent: 85}, false},
		{"neither set", "kind: KubeletConfiguration\nmaxPods: 250\n", DefaultLimits, false},
		{"other signals only: the default holds", "evictionHard:\n  memory.available: 500Mi\n", DefaultLimits, false},
		{"a stricter soft threshold holds", "evictionHard:\n  imagefs.available: 10%\nevictionSoft:\n  imagefs.available: 20%\n",
			Limits{EvictBelowPercent: 20, EvictFrom: "evictionSoft", GCHighPercent: 85}, false},
		{"a looser soft threshold does not", "evictionSoft:\n  imagefs.available: 5%\n", DefaultLimits, false},
		{"not a percentage", "imageGCHighThresholdPercent: 150\nevictionHard:\n  imagefs.available: 10%\n",
			Limits{EvictBelowPercent: 10, GCHighPercent: 85}, true},
		{"not a quantity: the default, not no threshold", "imageGCHighThresholdPercent: 70\nevictionHard:\n  imagefs.available: lots\n",
			Limits{EvictBelowPercent: 15, GCHighPercent: 70}, true},
		{"not a threshold percentage", "evictionHard:\n  imagefs.available: 120%\n", DefaultLimits, true},
		{"not YAML", "evictionHard: [\n", DefaultLimits, true},
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
			if err != nil && !strings.Contains(err.Error(), p) {
				t.Errorf("the error does not name the file: %v", err)
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestRoom_TheNearerThresholdBinds(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name        string
		l           Limits
		total, free int64
		room        int64
		why         string
	}{
		{"image GC binds", Limits{EvictBelowPercent: 10, GCHighPercent: 80}, 100 * gib, 40 * gib, 20 * gib, "above 80% use (imageGCHighThresholdPercent)"}, // 80 - 60 used
		{"eviction binds", Limits{EvictBelowPercent: 30, GCHighPercent: 95}, 100 * gib, 40 * gib, 10 * gib, "below 30% free (evictionHard"},                // 40 - 30
		{"absolute eviction", Limits{EvictBelowBytes: 35 * gib, GCHighPercent: 95}, 100 * gib, 40 * gib, 5 * gib, "below 35 GiB free"},
		{"soft eviction", Limits{EvictBelowPercent: 30, EvictFrom: "evictionSoft", GCHighPercent: 95}, 100 * gib, 40 * gib, 10 * gib, "(evictionSoft imagefs.available)"},
		{"fractional percent", Limits{EvictBelowPercent: 10, GCHighPercent: 82.5}, 100 * gib, 40 * gib, 22*gib + gib/2, "above 82.5% use"},
		{"the defaults: both at once", DefaultLimits, 100 * gib, 40 * gib, 25 * gib,
			"the kubelet deletes images above 85% use (imageGCHighThresholdPercent) and evicts pods below 15% free (evictionHard imagefs.available)"},
		{"already over", DefaultLimits, 100 * gib, 10 * gib, 0, "the kubelet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			room, why := tc.l.Room(tc.total, tc.free)
			if room != tc.room || !strings.Contains(why, tc.why) {
				t.Fatalf("room %s (%s), want %s (%s)", Human(room), why, Human(tc.room), tc.why)
			}
		})
	}
}

// A refusal names the filesystem, how much to free there and why.
func TestCheckRoom_SaysHowMuchToFreeWhere(t *testing.T) {
	dir := t.TempDir()
	if err := (Limits{GCHighPercent: 100}).CheckRoom(dir, 1, "one byte", "do this"); err != nil {
		t.Fatal(err)
	}
	err := DefaultLimits.CheckRoom(dir, 1<<62, "loading everything", "do this")
	for _, want := range []string{"not enough space in " + dir, "loading everything needs 4 EiB", "free ", " there: do this", "the kubelet"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v does not say %q", err, want)
		}
	}
	t.Log(err)
}

func TestMountPoint(t *testing.T) {
	if mp := MountPoint("/proc/self"); mp != "/proc" {
		t.Errorf("/proc/self: %q", mp)
	}
	if mp := MountPoint("/"); mp != "/" {
		t.Errorf("/: %q", mp)
	}
	if mp := MountPoint("/no/such/dir"); mp != "" {
		t.Errorf("a missing dir: %q", mp)
	}
}
