package hop

import (
	"errors"
	"fmt"
)

// ErrRefused marks a hop or a path the version operator would refuse.
var ErrRefused = errors.New("upgrade path refused")

// Check applies the version operator's rules to one hop, from the
// cluster's version to a target (its ClusterVersionGiantHop precondition,
// and ferry's own refusal of downgrades): within a major version, the
// same or the next minor; across one, 4.anything to 5.0 only, as the
// operator allows while 5.0 is the first of its major.
func Check(from, to string) error {
	f, okF := Parse(from)
	t, okT := Parse(to)
	switch {
	case !okF:
		return fmt.Errorf("%w: cannot read version %q", ErrRefused, from)
	case !okT:
		return fmt.Errorf("%w: cannot read version %q", ErrRefused, to)
	}
	switch c := t.Compare(f); {
	case c == 0:
		return fmt.Errorf("%w: the cluster is at %s already: a hop to it would change nothing", ErrRefused, from)
	case c < 0:
		return fmt.Errorf("%w: %s is older than %s: OpenShift does not downgrade", ErrRefused, to, from)
	}
	switch {
	case t.Major > f.Major && f.Major == 4 && t.Major == 5 && t.Minor == 0:
		return nil
	case t.Major > f.Major:
		return fmt.Errorf("%w: %s to %s crosses a major version: the version operator accepts only 4.y to 5.0 (then 5.0 onward, one minor at a time)", ErrRefused, from, to)
	case t.Minor > f.Minor+1:
		missing := Version{Major: f.Major, Minor: f.Minor + 1}
		return fmt.Errorf("%w: %s to %s skips %s: the version operator takes one minor version at a time; add a %s release to the path (or update to it first)",
			ErrRefused, from, to, missing.MinorOf(), missing.MinorOf())
	}
	return nil
}

// CheckPath checks that every hop of path, from the version from, is one
// the version operator accepts: a path with a gap is refused naming the
// missing minor version.
func CheckPath(from string, path []string) error {
	for _, to := range path {
		if err := Check(from, to); err != nil {
			return err
		}
		from = to
	}
	return nil
}
