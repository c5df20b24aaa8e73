// Package hop holds ferry's rules for an upgrade path, one release after
// another: which hops the cluster version operator accepts (Check,
// CheckPath), and, as the path runs, what to do next (Next).
package hop

import (
	"fmt"
	"strconv"
	"strings"
)

// Version is a release version, major.minor.patch[-pre][+build].
type Version struct {
	Major, Minor, Patch int
	Pre                 string
}

// Parse reads a release version; false when s is not major.minor.patch.
func Parse(s string) (Version, bool) {
	core, pre, _ := strings.Cut(strings.SplitN(s, "+", 2)[0], "-")
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return Version{}, false
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return Version{}, false
		}
		n[i] = v
	}
	return Version{n[0], n[1], n[2], pre}, true
}

// Compare orders versions as semver does (a pre-release sorts before its
// release; pre-releases compare as strings, enough for rc.N and ec.N).
func (v Version) Compare(w Version) int {
	for _, d := range [][2]int{{v.Major, w.Major}, {v.Minor, w.Minor}, {v.Patch, w.Patch}} {
		if d[0] != d[1] {
			if d[0] < d[1] {
				return -1
			}
			return 1
		}
	}
	switch {
	case v.Pre == w.Pre:
		return 0
	case v.Pre == "":
		return 1
	case w.Pre == "":
		return -1
	}
	return strings.Compare(v.Pre, w.Pre)
}

// MinorOf is major.minor.
func (v Version) MinorOf() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// IsMinorUpdate reports whether going from v to w changes the minor or
// major version: Upgradeable=False and admin-acks gate such a hop.
func (v Version) IsMinorUpdate(w Version) bool { return v.Major != w.Major || v.Minor != w.Minor }
