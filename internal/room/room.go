// Package room is the words for a disk's room that the room checks
// (internal/diskspace) and the agent's state machine share: the error
// for too little of it and a size as people read it. It links no more
// than strconv and strings, so that the state machine may import it.
package room

import (
	"errors"
	"strconv"
	"strings"
)

// ErrNoSpace means a filesystem lacks the room something needs.
var ErrNoSpace = errors.New("not enough space")

// Human formats n bytes in binary units ("16 GiB", "6.7 GiB", "512 B").
func Human(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	s := strings.TrimSuffix(strconv.FormatFloat(float64(n)/float64(div), 'f', 1, 64), ".0")
	return s + " " + string("KMGTPE"[exp]) + "iB"
}
