package bundle

import "github.com/ferry-edge/ferry/bundle/meta"

// DiskFilled reports whether err is a write that ran out of space.
func DiskFilled(err error) bool { return meta.DiskFilled(err) }

// IsRefusal reports whether err refuses the bundle itself.
func IsRefusal(err error) bool { return meta.IsRefusal(err) }

// Reason names the refusal in a word or two, for status lines.
func Reason(err error) string { return meta.Reason(err) }
