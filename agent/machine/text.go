package machine

import (
	"slices"
	"strconv"
	"strings"

	"github.com/ferry-edge/ferry/cluster"
)

// The machine writes its words with strconv and concatenation: fmt links
// more than this package may (TestImports). These say what fmt's verbs
// said, byte for byte.

// itoa is %d.
func itoa[I ~int | ~int64](n I) string { return strconv.FormatInt(int64(n), 10) }

// errText is an error as %v says it.
func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// oneDecimal is %.1f.
func oneDecimal(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

// wrapped is fmt.Errorf's %w: msg, which says err, and err for errors.Is.
type wrapped struct {
	msg string
	err error
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.err }

// wrap is an error that says msg and wraps err.
func wrap(err error, msg string) error { return &wrapped{msg: msg, err: err} }

// join is filepath.Join for a clean directory (Settings' are) and names
// without a slash, which filepath links more than this package may.
func join(dir string, names ...string) string {
	if dir == "" {
		return strings.Join(names, "/")
	}
	return strings.TrimSuffix(dir, "/") + "/" + strings.Join(names, "/")
}

// readyOf reads NodesReady ("3/5") as fmt.Sscanf's "%d/%d" did: 0 for
// what does not parse.
func readyOf(s string) (ready, waited int) {
	r, w, _ := strings.Cut(s, "/")
	ready, err := strconv.Atoi(r)
	if err != nil {
		return 0, 0 // Sscanf stops at the first it cannot read
	}
	waited, _ = strconv.Atoi(w)
	return ready, waited
}

// mapText is m as %v says it: map[k:v …], by key.
func mapText(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + ":" + m[k]
	}
	return "map[" + strings.Join(keys, " ") + "]"
}

// approvalsText is a as %v says it: [{bundle digest} …].
func approvalsText(a []cluster.Approval) string {
	parts := make([]string, len(a))
	for i, ap := range a {
		parts[i] = "{" + ap.Bundle + " " + ap.Digest + "}"
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// unknownEvent is what step panics with on an event it has no case for
// (a programming error: the runtime prints its type).
type unknownEvent struct{ Event }

// samePath reports whether a and b read the same (nil only as nil).
func samePath(a, b *PathRead) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.From == b.From && slices.Equal(a.Hops, b.Hops)
}

// sameMap reports whether a and b hold the same pairs.
func sameMap(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
