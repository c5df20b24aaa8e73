// Package pullspec is what a registry-mode pull is asked (Request) and
// how it stands (Status, Window): the words the agent, the local API and
// the puller share, apart from the puller's registry client (package pull).
package pullspec

import (
	"strconv"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/room"
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
		return "pulling " + rel + " from " + s.from() + ": waiting for the window " + s.Window + " (opens " + s.NextTry.Local().Format("15:04") + ")"
	case StateFetching:
		if s.ToFetch == 0 {
			return "pulling " + rel + " from " + s.from() + ": resolving " + strconv.Itoa(s.Images) + "/" + strconv.Itoa(s.Total) + " images"
		}
		eta := ""
		if s.ETA > 0 {
			eta = ", about " + s.ETA.Round(time.Second).String() + " left"
		}
		return "pulling " + rel + " from " + s.from() + ": " + room.Human(s.Bytes) + " of " + room.Human(s.ToFetch) + s.link() +
			" at " + room.Human(int64(s.Rate)) + "/s" + eta
	case StateRetrying:
		return "pulling " + rel + " from " + s.from() + ": failed " + strconv.Itoa(s.Attempts) + " times, next try " + s.NextTry.Local().Format("15:04:05") + ": " + s.Error
	case StateHanding:
		return "pulled " + rel + " from " + s.from() + ": verifying and extracting it"
	case StateDone:
		return "pulled " + rel + " from " + s.from()
	case StateFailed:
		return "pulling " + rel + " from " + s.from() + " failed: " + s.Error
	}
	return "pull " + s.State
}

// Coarse is Line in steps: whole percents and minutes. It goes into
// the UpgradeBundle, which every node watches: written when it changes,
// it changes about once a minute, not with every byte.
func (s Status) Coarse() string {
	if s.State != StateFetching || s.ToFetch == 0 {
		if s.State == StateRetrying {
			return "pulling " + shortRef(s.Release) + " from " + s.from() + ": failed " + strconv.Itoa(s.Attempts) + " times: " + s.Error
		}
		return s.Line()
	}
	eta := ""
	if s.ETA > 0 {
		eta = ", about " + max(s.ETA.Round(time.Minute), time.Minute).String() + " left"
	}
	return "pulling " + shortRef(s.Release) + " from " + s.from() + ": " + strconv.FormatInt(s.Bytes*100/s.ToFetch, 10) + "% of " +
		room.Human(s.ToFetch) + s.link() + eta
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
