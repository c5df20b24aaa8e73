package hop

import (
	"errors"
	"strings"
	"testing"
)

func TestCheck_FollowsTheVersionOperator(t *testing.T) {
	for _, tc := range []struct {
		from, to string
		says     string // "" accepted
	}{
		{"4.16.3", "4.16.9", ""},
		{"4.16.3", "4.17.0", ""},
		{"4.16.3", "4.17.20", ""},
		{"4.22.5", "5.0.0", ""},
		{"4.18.1", "5.0.2", ""},
		{"4.22.5", "5.0.0-rc.1", ""},
		{"4.16.3", "4.18.1", "skips 4.17"},
		{"4.16.3", "4.19.0", "skips 4.17"},
		{"4.22.5", "5.1.0", "crosses a major version"},
		{"5.0.3", "6.0.0", "crosses a major version"},
		{"4.16.3", "4.16.3", "at 4.16.3 already"},
		{"4.17.2", "4.16.9", "does not downgrade"},
		{"5.0.0", "4.22.5", "does not downgrade"},
		{"4.16", "4.17.0", "cannot read"},
	} {
		err := Check(tc.from, tc.to)
		switch {
		case tc.says == "" && err != nil:
			t.Errorf("%s → %s: refused (%v), the version operator accepts it", tc.from, tc.to, err)
		case tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says) || !errors.Is(err, ErrRefused)):
			t.Errorf("%s → %s: %v, want a refusal saying %q", tc.from, tc.to, err, tc.says)
		}
	}
}

func TestCheckPath_NamesTheMissingMinor(t *testing.T) {
	if err := CheckPath("4.16.3", []string{"4.17.20", "4.18.10"}); err != nil {
		t.Errorf("EUS-to-EUS path refused: %v", err)
	}
	if err := CheckPath("4.21.7", []string{"4.22.3", "5.0.0"}); err != nil {
		t.Errorf("4.last → 5.0 path refused: %v", err)
	}
	err := CheckPath("4.16.3", []string{"4.17.20", "4.19.2"})
	if err == nil || !strings.Contains(err.Error(), "skips 4.18") {
		t.Errorf("path with a gap: %v, want it to name 4.18", err)
	}
	err = CheckPath("4.16.3", []string{"4.18.10"})
	if err == nil || !strings.Contains(err.Error(), "skips 4.17") {
		t.Errorf("path with a gap: %v, want it to name 4.17", err)
	}
}

func TestVersion_ComparesAsReleasesDo(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"4.13.7", "4.13.7", 0}, {"4.13.8", "4.13.7", 1}, {"4.14.0", "4.13.20", 1},
		{"4.14.0-rc.1", "4.14.0", -1}, {"4.14.0-rc.2", "4.14.0-rc.1", 1}, {"5.0.0", "4.99.9", 1},
	} {
		a, okA := Parse(c.a)
		b, okB := Parse(c.b)
		if !okA || !okB || a.Compare(b) != c.want {
			t.Errorf("Compare(%s, %s) = %d (%v %v), want %d", c.a, c.b, a.Compare(b), okA, okB, c.want)
		}
	}
	for _, bad := range []string{"", "4.13", "4.x.1", "latest"} {
		if _, ok := Parse(bad); ok {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
