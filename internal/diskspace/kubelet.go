package diskspace

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/ferry-edge/ferry/internal/mountinfo"
)

// Limits are what the kubelet tolerates on its image filesystem before it
// acts: below EvictBelow free it evicts pods (its imagefs.available
// eviction threshold, hard or soft), above GCHighPercent used it deletes
// images (image garbage collection). A load that crosses either makes the
// kubelet delete images a disconnected site cannot pull again.
type Limits struct {
	EvictBelowBytes   int64   // absolute imagefs.available, or 0
	EvictBelowPercent float64 // imagefs.available as a percentage, or 0
	// EvictFrom names the setting the eviction threshold comes from
	// ("" for evictionHard, the kubelet's default).
	EvictFrom     string
	GCHighPercent float64
}

// DefaultLimits are the kubelet's defaults (imagefs.available 15%,
// imageGCHighThresholdPercent 85).
var DefaultLimits = Limits{EvictBelowPercent: 15, GCHighPercent: 85}

// ReadKubeletLimits reads a KubeletConfiguration (YAML or JSON, as
// OpenShift writes /etc/kubernetes/kubelet.conf); a missing file gives the
// defaults, and so does a setting it leaves out: the kubelet applies its
// own default for an evictionHard that lists other signals only, unless
// told not to merge, and assuming the default errs on the safe side. A
// soft eviction threshold evicts too (after its grace period): the
// stricter of the two holds. A setting that cannot be read keeps its
// default, and the error says which.
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
		EvictionSoft                map[string]string `yaml:"evictionSoft"`
		ImageGCHighThresholdPercent *float64          `yaml:"imageGCHighThresholdPercent"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		return l, fmt.Errorf("kubelet config %s: %w", path, err)
	}
	var errs []error
	if p := cfg.ImageGCHighThresholdPercent; p != nil {
		if *p <= 0 || *p > 100 {
			errs = append(errs, fmt.Errorf("kubelet config %s: imageGCHighThresholdPercent %v is not a percentage", path, *p))
		} else {
			l.GCHighPercent = *p
		}
	}
	if v, ok := cfg.EvictionHard["imagefs.available"]; ok {
		bytes, pct, err := parseThreshold(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("kubelet config %s: evictionHard imagefs.available %q: %w", path, v, err))
		} else {
			l.EvictBelowBytes, l.EvictBelowPercent = bytes, pct
		}
	}
	if v, ok := cfg.EvictionSoft["imagefs.available"]; ok {
		bytes, pct, err := parseThreshold(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("kubelet config %s: evictionSoft imagefs.available %q: %w", path, v, err))
		} else if bytes > l.EvictBelowBytes || pct > l.EvictBelowPercent {
			l.EvictBelowBytes, l.EvictBelowPercent = max(bytes, l.EvictBelowBytes), max(pct, l.EvictBelowPercent)
			l.EvictFrom = "evictionSoft"
		}
	}
	return l, errors.Join(errs...)
}

// parseThreshold reads an eviction threshold: a percentage ("15%") or a
// quantity of bytes ("10Gi").
func parseThreshold(v string) (bytes int64, pct float64, err error) {
	if p, ok := strings.CutSuffix(strings.TrimSpace(v), "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f < 0 || f > 100 {
			return 0, 0, errors.New("not a percentage")
		}
		return 0, f, nil
	}
	bytes, err = parseQuantity(v)
	return bytes, 0, err
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
	if err != nil || f < 0 || math.IsInf(f, 0) {
		return 0, errors.New("not a quantity of bytes")
	}
	return int64(math.Ceil(f * mult)), nil
}

// Usage is the size and free space of the filesystem holding path, as
// the kubelet counts them (free: what an unprivileged writer may use).
func Usage(path string) (total, free int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("checking free space in %s: %w", path, err)
	}
	return int64(st.Blocks) * int64(st.Bsize), int64(st.Bavail) * int64(st.Bsize), nil
}

// Room is how much can be written to a filesystem of total bytes with
// free bytes left before the kubelet acts (l), and which limit binds.
func (l Limits) Room(total, free int64) (int64, string) {
	evict := max(l.EvictBelowBytes, int64(float64(total)*l.EvictBelowPercent/100))
	byEvict := free - evict
	byGC := int64(float64(total)*l.GCHighPercent/100) - (total - free)
	gc := fmt.Sprintf("the kubelet deletes images above %s use (imageGCHighThresholdPercent)", percent(l.GCHighPercent))
	what := percent(l.EvictBelowPercent)
	if l.EvictBelowBytes > int64(float64(total)*l.EvictBelowPercent/100) {
		what = Human(l.EvictBelowBytes)
	}
	from := l.EvictFrom
	if from == "" {
		from = "evictionHard"
	}
	evicts := fmt.Sprintf("evicts pods below %s free (%s imagefs.available)", what, from)
	switch d := byGC - byEvict; {
	case d < -total/1000:
		return max(byGC, 0), gc
	case d <= total/1000:
		// Both at once, as with the kubelet's defaults (85% used is 15%
		// free).
		return max(min(byGC, byEvict), 0), gc + " and " + evicts
	}
	return max(byEvict, 0), "the kubelet " + evicts
}

func percent(p float64) string {
	return strings.TrimSuffix(strconv.FormatFloat(p, 'f', 1, 64), ".0") + "%"
}

// CheckRoom returns ErrNoSpace when writing need bytes (what, in words)
// to the filesystem holding path would cross what the kubelet tolerates
// (l); the error says how much to free on which filesystem, why, and what
// to do (fix).
func (l Limits) CheckRoom(path string, need int64, what, fix string) error {
	total, free, err := Usage(path)
	if err != nil {
		return err
	}
	room, why := l.Room(total, free)
	if need <= room {
		return nil
	}
	where := path
	if mp := MountPoint(path); mp != "" && mp != path {
		where = fmt.Sprintf("%s (the filesystem mounted on %s)", path, mp)
	}
	return fmt.Errorf("%w in %s: %s needs %s; of the %s free there, %s can be used: %s; free %s there: %s",
		ErrNoSpace, where, what, Human(need), Human(free), Human(room), why, Human(need-room), fix)
}

// MountPoint is where the filesystem holding path is mounted (the
// longest mount point above it in /proc/self/mountinfo, so that bind
// mounts such as RHCOS's /var count), or "" when it cannot tell.
func MountPoint(path string) string {
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		return ""
	}
	if p, err = filepath.Abs(p); err != nil {
		return ""
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	best := ""
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := mountinfo.Unescape(f[4])
		if (p == mp || mp == "/" || strings.HasPrefix(p, mp+"/")) && len(mp) > len(best) {
			best = mp
		}
	}
	return best
}
