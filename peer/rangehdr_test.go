package peer

import (
	"errors"
	"testing"
)

func TestParseRange(t *testing.T) {
	const size = 1000
	tests := []struct {
		name     string
		h        string
		start, n int64
		bad      bool
	}{
		{name: "closed range", h: "bytes=0-99", start: 0, n: 100},
		{name: "one byte", h: "bytes=5-5", start: 5, n: 1},
		{name: "open end runs to the last byte", h: "bytes=900-", start: 900, n: 100},
		{name: "end past the last byte is clamped", h: "bytes=990-5000", start: 990, n: 10},
		{name: "suffix is the last n bytes", h: "bytes=-10", start: 990, n: 10},
		{name: "suffix longer than the body is all of it", h: "bytes=-5000", start: 0, n: size},
		{name: "surrounding spaces are tolerated", h: "  bytes=1-2 ", start: 1, n: 2},
		{name: "start at the end is refused", h: "bytes=1000-", bad: true},
		{name: "start past the end is refused", h: "bytes=2000-3000", bad: true},
		{name: "several ranges are refused", h: "bytes=0-1,5-6", bad: true},
		{name: "other units are refused", h: "items=0-1", bad: true},
		{name: "end before start is refused", h: "bytes=10-5", bad: true},
		{name: "zero suffix is refused", h: "bytes=-0", bad: true},
		{name: "no dash is refused", h: "bytes=10", bad: true},
		{name: "empty spec is refused", h: "bytes=-", bad: true},
		{name: "signs are refused", h: "bytes=+1-2", bad: true},
		{name: "negative start is refused", h: "bytes=--1", bad: true},
		{name: "overflowing numbers are refused", h: "bytes=99999999999999999999-", bad: true},
		{name: "inner spaces are refused", h: "bytes=1 -2", bad: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start, n, err := ParseRange(tc.h, size)
			if tc.bad {
				if !errors.Is(err, ErrBadRange) {
					t.Fatalf("ParseRange(%q) = %d, %d, %v; want ErrBadRange", tc.h, start, n, err)
				}
				return
			}
			if err != nil || start != tc.start || n != tc.n {
				t.Fatalf("ParseRange(%q) = %d, %d, %v; want %d, %d", tc.h, start, n, err, tc.start, tc.n)
			}
		})
	}
}

func TestParseRange_EmptyBodyHasNoRange(t *testing.T) {
	for _, h := range []string{"bytes=0-", "bytes=-1", "bytes=0-0"} {
		if _, _, err := ParseRange(h, 0); !errors.Is(err, ErrBadRange) {
			t.Errorf("ParseRange(%q, 0): err %v, want ErrBadRange", h, err)
		}
	}
}

// FuzzParseRange checks that whatever the header, an accepted range lies
// inside the body and is not empty.
func FuzzParseRange(f *testing.F) {
	for _, s := range []string{"bytes=0-99", "bytes=-10", "bytes=5-", "bytes=0-1,2-3", "bytes=18446744073709551615-", "bytes=9223372036854775807-9223372036854775807", "bytes= 1-2", ""} {
		f.Add(s, int64(1000))
	}
	f.Add("bytes=0-0", int64(1))
	f.Add("bytes=-1", int64(0))
	f.Fuzz(func(t *testing.T, h string, size int64) {
		start, n, err := ParseRange(h, size)
		if err != nil {
			if !errors.Is(err, ErrBadRange) {
				t.Fatalf("error %v does not wrap ErrBadRange", err)
			}
			return
		}
		if start < 0 || n < 1 || start+n > size || start+n < start {
			t.Fatalf("ParseRange(%q, %d) = %d, %d: outside the body", h, size, start, n)
		}
	})
}
