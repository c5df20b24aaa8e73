package diskspace

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"
)

// Limits are what the kubelet tolerates on its image filesystem before it
// acts: below EvictBelow free it evicts pods (its imagefs.available hard
// eviction threshold), above GCHighPercent used it deletes images (image
// garbage collection). A load that crosses either makes the kubelet delete
// images a disconnected site cannot pull again.
type Limits struct {
	EvictBelowBytes   int64   // absolute imagefs.available, or 0
	EvictBelowPercent float64 // imagefs.available as a percentage, or 0
	GCHighPercent     float64
}

// DefaultLimits are the kubelet's defaults (imagefs.available 15%,
// imageGCHighThresholdPercent 85).
var DefaultLimits = Limits{EvictBelowPercent: 15, GCHighPercent: 85}

// ReadKubeletLimits reads a KubeletConfiguration (YAML or JSON, as
// OpenShift writes /etc/kubernetes/kubelet.conf); a missing file gives the
// defaults, and so does a setting it leaves out.
func ReadKubeletLimits(path string) (Limits, error) {
	l := DefaultLimits
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return l, err
	}
	var cfg struct {
		EvictionHard                map[string]string `yaml:"evictionHard"`
		ImageGCHighThresholdPercent *float64          `yaml:"imageGCHighThresholdPercent"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		return l, fmt.Errorf("kubelet config %s: %w", path, err)
	}
	if p := cfg.ImageGCHighThresholdPercent; p != nil {
		if *p <= 0 || *p > 100 {
			return l, fmt.Errorf("kubelet config %s: imageGCHighThresholdPercent %v is not a percentage", path, *p)
		}
		l.GCHighPercent = *p
	}
	if v, ok := cfg.EvictionHard["imagefs.available"]; ok {
		l.EvictBelowBytes, l.EvictBelowPercent = 0, 0
		if pct, ok := strings.CutSuffix(strings.TrimSpace(v), "%"); ok {
			f, err := strconv.ParseFloat(pct, 64)
			if err != nil || f < 0 || f > 100 {
				return l, fmt.Errorf("kubelet config %s: evictionHard imagefs.available %q is not a percentage", path, v)
			}
			l.EvictBelowPercent = f
		} else if l.EvictBelowBytes, err = parseQuantity(v); err != nil {
			return l, fmt.Errorf("kubelet config %s: evictionHard imagefs.available %q: %w", path, v, err)
		}
	}
	return l, nil
}

// parseQuantity reads a Kubernetes quantity of bytes: 10Gi, 500M, 1024.
func parseQuantity(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}}
	mult := 1.0
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = n, u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 {
		return 0, errors.New("not a quantity of bytes")
	}
	return int64(math.Ceil(f * mult)), nil
}

// Usage is the size and free space of the filesystem holding path.
func Usage(path string) (total, free int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("checking free space in %s: %w", path, err)
	}
	return int64(st.Blocks) * int64(st.Bsize), int64(st.Bavail) * int64(st.Bsize), nil
}

// Headroom is how much can be written to a filesystem of total bytes with
// free bytes left before the kubelet acts (l), and which limit binds.
func (l Limits) Headroom(total, free int64) (int64, string) {
	evict := max(l.EvictBelowBytes, int64(float64(total)*l.EvictBelowPercent/100))
	byEvict := free - evict
	byGC := int64(float64(total)*l.GCHighPercent/100) - (total - free)
	if byGC < byEvict {
		return max(byGC, 0), fmt.Sprintf("the kubelet deletes images above %.0f%% use (imageGCHighThresholdPercent)", l.GCHighPercent)
	}
	what := fmt.Sprintf("%.0f%%", l.EvictBelowPercent)
	if l.EvictBelowBytes > 0 {
		what = Human(l.EvictBelowBytes)
	}
	return max(byEvict, 0), fmt.Sprintf("the kubelet evicts pods below %s free (evictionHard imagefs.available)", what)
}

// CheckKubelet returns ErrNoSpace when writing need bytes to the
// filesystem holding path would cross what the kubelet tolerates (l); the
// error says how much to free there, why, and what to do (fix).
func CheckKubelet(path string, need int64, l Limits, what, fix string) error {
	total, free, err := Usage(path)
	if err != nil {
		return err
	}
	room, why := l.Headroom(total, free)
	if need <= room {
		return nil
	}
	return fmt.Errorf("%w in %s: %s needs %s, and %s free there leaves room for %s only: %s; free %s there: %s",
		ErrNoSpace, path, what, Human(need), Human(free), Human(room), why, Human(need-room), fix)
}
