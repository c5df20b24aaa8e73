package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	if got := Unescape(`/mnt/a\040stick`); got != "/mnt/a stick" {
		t.Errorf("unescape: %q", got)
	}
}
