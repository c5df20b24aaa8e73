package agent

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestSanitizeReason(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"plain", "digest sha256:3f… is not approved", "digest sha256:3f… is not approved"},
		{"newlines collapse", "first line\nsecond\r\n\tthird", "first line second third"},
		{"control characters dropped", "a\x1b[31mred\x1b[0m\x00b\x07", "a[31mred[0mb"},
		{"a forged systemd field", "bad\nSTATUS=all good\nREADY=1", "bad STATUS=all good READY=1"},
		{"bidi override dropped", "upgrade-\u202etar.exe", "upgrade-tar.exe"},
		{"invalid UTF-8 dropped", "a\xff\xfeb", "ab"},
		{"leading and trailing space", "\n  reason \n", "reason"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SanitizeReason(tt.in); got != tt.want {
				t.Errorf("SanitizeReason(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestSanitizeReason_KeepsWhatFailedAndTheFix(t *testing.T) {
	in := "images not loaded: quay.io/x@sha256:1 (first error: " + strings.Repeat("CRI-O says something long. ", 100) + "): the bundle is damaged; make it again"
	got := SanitizeReason(in)
	if len(got) > MaxReason || !strings.HasPrefix(got, "images not loaded: quay.io/x@sha256:1") || !strings.HasSuffix(got, "; make it again") || !strings.Contains(got, "…") {
		t.Errorf("SanitizeReason = %q", got)
	}
}

func TestSanitizeReason_BoundsWithAnEllipsis(t *testing.T) {
	for _, in := range []string{
		strings.Repeat("x", 10000),
		strings.Repeat("é", 1000), // a cut inside a character
		strings.Repeat("ab\n", 5000),
	} {
		got := SanitizeReason(in)
		if len(got) > MaxReason || !strings.Contains(got, "…") || !utf8.ValidString(got) {
			t.Errorf("SanitizeReason(%d bytes) = %d bytes %q", len(in), len(got), got)
		}
		if again := SanitizeReason(got); again != got {
			t.Errorf("not idempotent: %q → %q", got, again)
		}
	}
	exact := strings.Repeat("y", MaxReason)
	if got := SanitizeReason(exact); got != exact {
		t.Errorf("a reason of exactly MaxReason bytes was changed to %q", got)
	}
}

func FuzzSanitizeReason(f *testing.F) {
	f.Add("a\nb\x00c")
	f.Add(strings.Repeat("\u202e", 200))
	f.Fuzz(func(t *testing.T, s string) {
		got := SanitizeReason(s)
		if len(got) > MaxReason || !utf8.ValidString(got) {
			t.Fatalf("%q → %q", s, got)
		}
		for _, r := range got {
			if r != ' ' && (!unicode.IsPrint(r) || unicode.IsSpace(r)) {
				t.Fatalf("%q → %q holds %U", s, got, r)
			}
		}
		if SanitizeReason(got) != got {
			t.Fatalf("not idempotent on %q", s)
		}
	})
}
