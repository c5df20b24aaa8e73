package machine

import (
	"slices"
	"time"

	"github.com/ferry-edge/ferry/bundle/meta"
	"github.com/ferry-edge/ferry/internal/digest"
)

// Settings are the few values of the node's config that the machine
// decides with; the agent reads them from its Config (settingsOf).
type Settings struct {
	NodeName string
	// ApprovalOff: any bundle whose sha256 checks is loaded.
	ApprovalOff bool
	// OnReady is the cluster hook's argv; Schedule "Automatic" runs it
	// when every node is loaded, "Manual" waits for ferry proceed.
	OnReady  []string
	Schedule string
	// ExtractDir holds the extracted trees; StateDir the records.
	ExtractDir string
	StateDir   string
	// KeepRunningRelease keeps an upgraded bundle's tree as the running
	// release's source until the next upgrade is done.
	KeepRunningRelease bool
	// Peers are the other nodes the config names; PeersClosed: the peer
	// server has neither node identity, nor a token, nor leave to be open.
	Peers       []string
	PeersClosed bool
}

// Logger is what the machine logs with: *slog.Logger's methods, so that
// the agent passes its own and the machine links no log/slog
// (TestImports).
type Logger interface {
	Debug(msg string, args ...any)
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
	Error(msg string, args ...any)
}

// withArgs is a Logger with args before each line's own (withLog), as
// slog.Logger.With.
type withArgs struct {
	l    Logger
	args []any
}

func withLog(l Logger, args ...any) Logger {
	if w, ok := l.(withArgs); ok {
		return withArgs{w.l, append(slices.Clip(w.args), args...)}
	}
	return withArgs{l, args}
}

func (w withArgs) Debug(msg string, args ...any) {
	w.l.Debug(msg, append(slices.Clip(w.args), args...)...)
}
func (w withArgs) Info(msg string, args ...any) {
	w.l.Info(msg, append(slices.Clip(w.args), args...)...)
}
func (w withArgs) Warn(msg string, args ...any) {
	w.l.Warn(msg, append(slices.Clip(w.args), args...)...)
}
func (w withArgs) Error(msg string, args ...any) {
	w.l.Error(msg, append(slices.Clip(w.args), args...)...)
}

// Wiring says which of the agent's parts are there and gives the clock
// and the log: the machine acts on their presence, never on the parts.
type Wiring struct {
	Now      func() time.Time
	Log      Logger // the agent's *slog.Logger
	Media    bool   // sticks are watched
	Loader   bool   // CRI-O is there to load into
	Peers    bool   // a peer transport is wired
	API      bool   // the cluster's API is wired
	Warnings []string
	// ParseMetadata and ApproveOffer are bundle's (bundle.ParseMetadata,
	// bundle.ApproveOffer): they read JSON and check signatures, which
	// links more than this package may (TestImports), and do no I/O.
	ParseMetadata func([]byte) (*meta.Metadata, error)
	ApproveOffer  func(p meta.Policy, md *meta.Metadata, d digest.Digest, sig []byte) (meta.Approval, error)
}
