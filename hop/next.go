package hop

import "fmt"

// A path runs hop after hop: (for a minor-version path, when the
// administrator keeps the default) the non-master pools paused, then each
// hop's desiredUpdate once the hop before it is Completed, then the pools
// unpaused. Next says what to do from how things stand; the caller reads
// the cluster, calls it, and does what it says, as often as it likes.

// HopState is where the version operator's upgrade to one hop stands.
type HopState int

const (
	NotAsked  HopState = iota // desiredUpdate names another release
	Asked                     // desiredUpdate names it; not begun, or underway
	Completed                 // a history entry for it is Completed
	Refused                   // the operator refuses it (ReleaseAccepted=False)
)

// State is how a path stands.
type State struct {
	From     string     // the cluster's version before the path
	Versions []string   // each hop's version, in order
	Hops     []HopState // each hop's state, as Versions
	// Pause: the non-master pools are to be paused for the path (the
	// administrator's choice, by default for a minor-version path).
	Pause bool
	// Paused: ferry has paused the pools for this path (and not yet
	// unpaused them).
	Paused bool
}

// Action is what Next says to do.
type Action struct {
	Do  Do
	Hop int // the hop Do is about (AskHop, WaitHop, Failed)
}

// Do is one kind of Action.
type Do string

const (
	PausePools   Do = "pause-pools"   // pause the non-master pools
	AskHop       Do = "ask-hop"       // the hop's signatures, then its desiredUpdate
	WaitHop      Do = "wait-hop"      // the hop is asked or underway: wait for Completed
	UnpausePools Do = "unpause-pools" // the last hop is Completed: unpause what ferry paused
	Done         Do = "done"          // every hop Completed, no pool held
	Failed       Do = "failed"        // the hop is refused: the path stops there
)

// MinorPath reports whether a path from the version from crosses a minor
// (or major) version: the update docs' EUS-to-EUS procedure pauses the
// worker pools for such a path, so that workers reboot once.
func MinorPath(from string, versions []string) bool {
	f, ok := Parse(from)
	if !ok || len(versions) < 2 {
		return false
	}
	last, ok := Parse(versions[len(versions)-1])
	return ok && f.IsMinorUpdate(last)
}

// Next is what to do now. Hops are taken in order, never skipping: the
// first hop not Completed is the one acted on, whatever the later ones
// say.
func Next(s State) Action {
	for i, h := range s.Hops {
		switch h {
		case Completed:
			continue
		case Refused:
			return Action{Do: Failed, Hop: i}
		case Asked:
			return Action{Do: WaitHop, Hop: i}
		}
		for _, later := range s.Hops[i+1:] {
			if later != NotAsked {
				// Sent past this hop by someone else: asking it now
				// would send the cluster back.
				return Action{Do: Failed, Hop: i}
			}
		}
		if i == 0 && s.Pause && !s.Paused {
			return Action{Do: PausePools}
		}
		return Action{Do: AskHop, Hop: i}
	}
	if s.Paused {
		return Action{Do: UnpausePools, Hop: len(s.Hops) - 1}
	}
	return Action{Do: Done, Hop: len(s.Hops) - 1}
}

// Describe says an action as the UpgradeBundle and the Events say it.
func (s State) Describe(a Action) string {
	n := len(s.Versions)
	v := func(i int) string {
		if i >= 0 && i < n {
			return s.Versions[i]
		}
		return "?"
	}
	switch a.Do {
	case PausePools:
		return fmt.Sprintf("pausing the non-master machine config pools for the path %s (workers reboot once, at the end)", s.path())
	case AskHop:
		return fmt.Sprintf("hop %d of %d: asking the cluster for %s", a.Hop+1, n, v(a.Hop))
	case WaitHop:
		return fmt.Sprintf("hop %d of %d: the cluster is upgrading to %s", a.Hop+1, n, v(a.Hop))
	case UnpausePools:
		return fmt.Sprintf("the path %s is done: unpausing the machine config pools ferry paused", s.path())
	case Done:
		return fmt.Sprintf("the path %s is done", s.path())
	case Failed:
		return fmt.Sprintf("hop %d of %d (%s) failed: the path stops at %s", a.Hop+1, n, v(a.Hop), s.at(a.Hop))
	}
	return string(a.Do)
}

func (s State) path() string {
	p := s.From
	for _, v := range s.Versions {
		if p != "" {
			p += " → "
		}
		p += v
	}
	return p
}

// at is the version the cluster is at while hop i is not done.
func (s State) at(i int) string {
	if i > 0 {
		return s.Versions[i-1]
	}
	return s.From
}
