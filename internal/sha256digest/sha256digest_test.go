package sha256digest

import (
	"strings"
	"testing"
)

func TestValid_OnlyLowercaseSHA256(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"sha256:" + hex, true},
		{"sha256:" + strings.ToUpper(hex), false},
		{"sha256:" + hex[:63], false},
		{"sha256:" + hex + "0", false},
		{hex, false},
		{"sha512:" + hex + hex, false},
		{"sha256:" + hex[:62] + "zz", false},
		{"sha256:" + strings.Repeat("g", 64), false},
		{"sha256:../../etc/passwd", false}, // it names files on the shelf and in URLs
		{"sha512:" + hex, false},
		{"", false},
	} {
		if got := Valid(tc.in); got != tc.want {
			t.Errorf("Valid(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if _, err := Parse("sha512:" + hex + hex); err == nil || !strings.Contains(err.Error(), "not a sha256 digest") {
		t.Errorf("Parse of a sha512 digest: %v", err)
	}
}

func TestFromHex(t *testing.T) {
	hex := strings.Repeat("0f", 32)
	if d, ok := FromHex(hex); !ok || string(d) != "sha256:"+hex {
		t.Errorf("FromHex(%q) = %q, %v", hex, d, ok)
	}
	if _, ok := FromHex("sha256:" + hex); ok {
		t.Error("FromHex took a prefixed digest for hex")
	}
}

func TestShort_OneFormWithOrWithoutPrefix(t *testing.T) {
	hex := "0123456789abcdef" + strings.Repeat("0", 48)
	for _, in := range []string{"sha256:" + hex, hex} {
		if got := Short(in); got != "sha256:0123456789ab" {
			t.Errorf("Short(%q) = %q", in, got)
		}
	}
}
