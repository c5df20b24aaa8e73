// Package pullspec is what a registry-mode pull is asked (Request) and
// how it stands (Status, Window): the words the agent, the local API and
// the puller share, apart from the puller's registry client (package pull).
package pullspec

import (
	"fmt"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/digest"
)

// Request is what to pull: a release by digest and extra images (by tag
// or digest).
type Request struct {
	Release string   `json:"release"`
	Extras  []string `json:"extras,omitempty"`
	// Bundle is the UpgradeBundle that asks for it ("" for ferry load).
	Bundle string `json:"bundle,omitempty"`
	// RateLimit and Window, when set, replace the node's (Options).
	RateLimit string `json:"rateLimit,omitempty"`
	Window    string `json:"window,omitempty"`
	// Created is the bundle's metadata.created: every node making the
	// bundle of one request makes the same bytes. Zero: now.
	Created time.Time `json:"created,omitzero"`
	// Pins, for a node that follows another's pull, are the digests the
	// followed node published for the extras given by tag: its bundle
	// must hold those (create.Options.Pins).
	Pins map[string]digest.Digest `json:"pins,omitempty"`
	// From, for a node that follows another's pull, is that node's peer
	// address (host:port): every image, blob and signature comes from it
	// (Handler), never from the site's registry. FromNode names it.
	From     string `json:"from,omitempty"`
	FromNode string `json:"fromNode,omitempty"`
}

// States of a pull (Status.State).
const (
	StateWaiting    = "waiting"  // for the time window
	StateFetching   = "fetching" // from the registry
	StateRetrying   = "retrying" // after a failure, until NextTry
	StateHanding    = "handing"  // the bundle is made; the agent takes it
	StateDone       = "done"     // the agent holds the bundle
	StateFailed     = "failed"   // cannot succeed as asked (Error says why)
	StateNotStarted = "not-started"
)

// Status is a pull's progress, for ferry status and the unit's line.
type Status struct {
	State    string        `json:"state"`
	Release  string        `json:"release"`
	Bundle   string        `json:"bundle,omitempty"` // the UpgradeBundle that asks for it
	Images   int           `json:"images,omitempty"`
	Total    int           `json:"imagesTotal,omitempty"`
	Bytes    int64         `json:"bytes"`      // over the link so far, this run
	ToFetch  int64         `json:"bytesTotal"` // what the run has to fetch
	Rate     float64       `json:"rate"`       // bytes per second
	ETA      time.Duration `json:"eta,omitempty"`
	Window   string        `json:"window,omitempty"`
	Error    string        `json:"error,omitempty"`
	Attempts int           `json:"attempts,omitempty"` // failed runs in a row
	NextTry  time.Time     `json:"nextTry,omitzero"`
	Digest   digest.Digest `json:"digest,omitempty"` // the bundle made
	From     string        `json:"from,omitempty"`   // the node followed (Request.FromNode)
	// Extras are the digests the extras given by tag resolved to, once
	// this node's own pull resolved them: published through the API for
	// the nodes that follow it to pin.
	Extras map[string]digest.Digest `json:"extras,omitempty"`
	// Shared is the bytes this node's pull served to the nodes following
	// it; it serves only while it pulls. Waiting is their requests
	// waiting for blobs it still fetches.
	Shared  int64 `json:"shared,omitempty"`
	Waiting int   `json:"waiting,omitempty"`
}

// Line is the status in one line.
func (s Status) Line() string {
	rel := shortRef(s.Release)
	switch s.State {
	case StateWaiting:
		return fmt.Sprintf("pulling %s from %s: waiting for the window %s (opens %s)", rel, s.from(), s.Window, s.NextTry.Local().Format("15:04"))
	case StateFetching:
		if s.ToFetch == 0 {
			return fmt.Sprintf("pulling %s from %s: resolving %d/%d images", rel, s.from(), s.Images, s.Total)
		}
		eta := ""
		if s.ETA > 0 {
			eta = ", about " + s.ETA.Round(time.Second).String() + " left"
		}
		return fmt.Sprintf("pulling %s from %s: %s of %s%s at %s/s%s", rel, s.from(),
			bundle.HumanSize(s.Bytes), bundle.HumanSize(s.ToFetch), s.link(), bundle.HumanSize(int64(s.Rate)), eta)
	case StateRetrying:
		return fmt.Sprintf("pulling %s from %s: failed %d times, next try %s: %s", rel, s.from(), s.Attempts, s.NextTry.Local().Format("15:04:05"), s.Error)
	case StateHanding:
		return fmt.Sprintf("pulled %s from %s: verifying and extracting it", rel, s.from())
	case StateDone:
		return fmt.Sprintf("pulled %s from %s", rel, s.from())
	case StateFailed:
		return fmt.Sprintf("pulling %s from %s failed: %s", rel, s.from(), s.Error)
	}
	return "pull " + s.State
}

// Coarse is Line in steps: whole percents and minutes. It goes into
// the UpgradeBundle, which every node watches: written when it changes,
// it changes about once a minute, not with every byte.
func (s Status) Coarse() string {
	if s.State != StateFetching || s.ToFetch == 0 {
		if s.State == StateRetrying {
			return fmt.Sprintf("pulling %s from %s: failed %d times: %s", shortRef(s.Release), s.from(), s.Attempts, s.Error)
		}
		return s.Line()
	}
	eta := ""
	if s.ETA > 0 {
		eta = ", about " + max(s.ETA.Round(time.Minute), time.Minute).String() + " left"
	}
	return fmt.Sprintf("pulling %s from %s: %d%% of %s%s%s", shortRef(s.Release), s.from(),
		s.Bytes*100/s.ToFetch, bundle.HumanSize(s.ToFetch), s.link(), eta)
}

// from is where the pull fetches, in words.
func (s Status) from() string {
	if s.From == "" {
		return "the registry"
	}
	return "node " + s.From
}

// link names the site's link for a pull that crosses it.
func (s Status) link() string {
	if s.From == "" {
		return " over the link"
	}
	return ""
}

func shortRef(r string) string {
	if i := strings.LastIndex(r, "@sha256:"); i >= 0 && len(r) > i+20 {
		return r[:i+20] + "…"
	}
	return r
}
