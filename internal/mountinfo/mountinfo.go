// Package mountinfo reads what /proc/self/mountinfo writes: the stick's
// mounts (media) and the filesystems the kubelet's thresholds apply to
// (diskspace) read paths from it alike.
package mountinfo

import (
	"strconv"
	"strings"
)

// Unescape undoes the kernel's \ooo escapes of space, tab, newline and
// backslash in mount paths (\040 for a space).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
