package peer

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseRange reads a Range header for a body of size bytes and returns the
// one byte range it asks for as [start, start+n). Only a single range is
// served: "bytes=a-b", "bytes=a-" or "bytes=-n" (the last n bytes). A list
// of ranges, another unit, a malformed value or a range starting past the
// end is ErrBadRange (the server answers 416 with Content-Range
// "bytes */size"). An end past the last byte is clamped to it.
func ParseRange(h string, size int64) (start, n int64, err error) {
	bad := func(why string) (int64, int64, error) {
		return 0, 0, fmt.Errorf("%w: %q: %s", ErrBadRange, h, why)
	}
	spec, ok := strings.CutPrefix(strings.TrimSpace(h), "bytes=")
	if !ok {
		return bad("only bytes=… ranges are served")
	}
	if strings.Contains(spec, ",") {
		return bad("only one range per request is served")
	}
	first, last, ok := strings.Cut(spec, "-")
	if !ok {
		return bad("no '-'")
	}
	num := func(s string) (int64, bool) {
		if s == "" || len(s) > 19 {
			return 0, false
		}
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				return 0, false
			}
		}
		v, err := strconv.ParseInt(s, 10, 64)
		return v, err == nil
	}
	if first == "" { // suffix: the last n bytes
		k, ok := num(last)
		if !ok || k == 0 {
			return bad("bad suffix length")
		}
		if size <= 0 {
			return bad("empty body")
		}
		k = min(k, size)
		return size - k, k, nil
	}
	a, ok := num(first)
	if !ok {
		return bad("bad first byte")
	}
	if a >= size {
		return bad(fmt.Sprintf("starts at or past the end (%d bytes)", size))
	}
	end := size - 1
	if last != "" {
		b, ok := num(last)
		if !ok {
			return bad("bad last byte")
		}
		if b < a {
			return bad("last byte before first")
		}
		end = min(b, end)
	}
	return a, end - a + 1, nil
}
