package pullspec

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// Window is the time of day the link may be used, in the node's local
// time: From to To, across midnight when To is earlier ("22:00-06:00").
// The zero Window is always open.
type Window struct {
	From, To time.Duration // since midnight
	set      bool
}

// ParseWindow reads "HH:MM-HH:MM"; "" is always open.
func ParseWindow(s string) (Window, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Window{}, nil
	}
	from, to, ok := strings.Cut(s, "-")
	if !ok {
		return Window{}, errors.New("window " + strconv.Quote(s) + ": want HH:MM-HH:MM, e.g. 22:00-06:00")
	}
	f, err := clock(from)
	if err != nil {
		return Window{}, errors.New("window " + strconv.Quote(s) + ": " + err.Error())
	}
	t, err := clock(to)
	if err != nil {
		return Window{}, errors.New("window " + strconv.Quote(s) + ": " + err.Error())
	}
	if f == t {
		return Window{}, errors.New("window " + strconv.Quote(s) + ": it starts when it ends: leave it empty for always")
	}
	return Window{From: f, To: t, set: true}, nil
}

func clock(s string) (time.Duration, error) {
	h, m, ok := strings.Cut(strings.TrimSpace(s), ":")
	hh, err1 := strconv.Atoi(h)
	mm, err2 := strconv.Atoi(m)
	if !ok || err1 != nil || err2 != nil || hh < 0 || hh > 24 || mm < 0 || mm > 59 || hh == 24 && mm != 0 {
		return 0, errors.New(strconv.Quote(s) + " is not a time of day (HH:MM)")
	}
	return time.Duration(hh)*time.Hour + time.Duration(mm)*time.Minute, nil
}

// Always reports whether the window is always open.
func (w Window) Always() bool { return !w.set }

func (w Window) String() string {
	if !w.set {
		return "always"
	}
	two := func(n int) string { return string([]byte{byte('0' + n/10%10), byte('0' + n%10)}) }
	f := func(d time.Duration) string { return two(int(d.Hours())) + ":" + two(int(d.Minutes())%60) }
	return f(w.From) + "-" + f(w.To)
}

// State says whether the window is open at t and when that changes next
// (the zero time when it never does).
func (w Window) State(t time.Time) (open bool, change time.Time) {
	if !w.set {
		return true, time.Time{}
	}
	y, mo, d := t.Date()
	midnight := time.Date(y, mo, d, 0, 0, 0, 0, t.Location())
	at := func(day int, off time.Duration) time.Time {
		return time.Date(y, mo, d+day, 0, 0, 0, 0, t.Location()).Add(off)
	}
	since := t.Sub(midnight)
	if w.From < w.To { // within one day
		switch {
		case since < w.From:
			return false, at(0, w.From)
		case since < w.To:
			return true, at(0, w.To)
		default:
			return false, at(1, w.From)
		}
	}
	// Across midnight: open before To and from From on.
	switch {
	case since < w.To:
		return true, at(0, w.To)
	case since < w.From:
		return false, at(0, w.From)
	default:
		return true, at(1, w.To)
	}
}
