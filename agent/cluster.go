package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/peer"
)

// Peers is the agent's view of the other nodes (peer.Shelf + peer.Fetcher).
type Peers interface {
	// Share serves a verified bundle's tar bytes to the peers; pieces,
	// when not nil, is its piece list as hashed in the extraction pass.
	Share(digest string, meta []byte, r io.ReaderAt, size int64, pieces *peer.PieceList) error
	Unshare(digest string)
	Discover(ctx context.Context) ([]peer.PeerOffer, error)
	Fetch(ctx context.Context, digest, dest string, progress func(peer.Progress)) error
	Statuses(ctx context.Context) map[string]peer.PeerStatus
}

// view is one poll of the peers.
type view struct {
	offers   []peer.PeerOffer
	statuses map[string]peer.PeerStatus
	at       time.Time
}

// pollPeers sends a view of the peers to the main loop every interval.
func (a *Agent) pollPeers(ctx context.Context, interval time.Duration, out chan<- view) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, interval+5*time.Second)
		offers, _ := a.deps.Peers.Discover(pctx)
		st := a.deps.Peers.Statuses(pctx)
		cancel()
		select {
		case out <- view{offers: offers, statuses: st, at: time.Now()}:
		case <-ctx.Done():
			return
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// PeerStatus is what this node tells its peers.
func (a *Agent) PeerStatus() peer.Status {
	s := a.Status()
	ps := peer.Status{Node: s.Node, Phase: s.Phase, Digest: s.Digest, Version: s.Version, Release: s.Release, Error: s.Error}
	a.mu.Lock()
	held := a.active != nil && a.active.Digest == s.Digest
	if held {
		ps.Source = a.active.Plugged
	}
	a.mu.Unlock()
	if !held {
		// A refused bundle is not held. A held one in conflict is: the
		// peers must keep seeing it to see the conflict.
		ps.Digest = ""
	}
	return ps
}

// onView acts on a fresh view of the peers.
func (a *Agent) onView(ctx context.Context, v view) {
	a.mu.Lock()
	old := a.view
	a.view = v
	r, busy := a.active, a.busy
	a.mu.Unlock()
	for _, p := range a.cfg.Peer.Peers {
		now, was := v.statuses[p].Err, old.statuses[p].Err
		if now != nil && (was == nil || was.Error() != now.Error()) {
			a.log.Warn("a peer cannot be asked", "peer", p, "err", now)
		} else if now == nil && was != nil {
			a.log.Info("a peer answers again", "peer", p)
		}
	}
	switch {
	case r == nil && busy == "":
		a.maybeFetch(ctx, v)
	case r == nil:
	case r.Phase == PhaseExtracted && busy == "":
		a.next(ctx)
	case r.Phase == PhaseLoaded || r.Phase == PhaseClusterReady:
		a.gate(ctx, r, v)
	}
}

// maybeFetch starts fetching the bundle the peers offer, after the same
// checks a stick gets.
func (a *Agent) maybeFetch(ctx context.Context, v view) {
	byDigest := map[string]peer.PeerOffer{}
	for _, o := range v.offers {
		byDigest[o.Digest] = o
	}
	if len(byDigest) == 0 {
		return
	}
	if len(byDigest) > 1 {
		ds := make([]string, 0, len(byDigest))
		for d := range byDigest {
			ds = append(ds, shortDigest(d))
		}
		sort.Strings(ds)
		a.reportConflict(fmt.Sprintf("the peers hold different bundles (%s): two sticks were plugged; remove one and run 'ferry cleanup' on the nodes that hold it", strings.Join(ds, ", ")))
		return
	}
	var o peer.PeerOffer
	for _, x := range byDigest {
		o = x
	}
	id := strings.TrimPrefix(o.Digest, "sha256:")
	a.mu.Lock()
	old := a.records[id]
	a.mu.Unlock()
	if old != nil && (old.Phase == PhaseRejected || old.Phase == PhaseCleaned) {
		return // refused or done with before: not again
	}
	meta, err := bundle.ParseMetadata(o.Metadata)
	name := "bundle from " + o.Peer
	if meta != nil {
		name = meta.Name() + ".tar"
	}
	r := &Record{ID: id, Digest: o.Digest, Name: name, Metadata: meta, Origin: "peer", Source: o.Peer}
	if err == nil {
		err = a.checkPeerBundle(meta, o.Digest)
	}
	if err != nil {
		a.reject(r, err)
		return
	}
	r.Dir = filepath.Join(a.cfg.Paths.ExtractDir, meta.DirName())
	a.mu.Lock()
	a.active = r
	a.mu.Unlock()
	a.startFetch(ctx, r)
}

// checkPeerBundle applies arch and approval to a peer's offer before any
// byte is fetched. A peer cannot show a signature, so with approval on the
// digest itself must be approved.
func (a *Agent) checkPeerBundle(meta *bundle.Metadata, digest string) error {
	if meta.Arch != a.cfg.Arch {
		return fmt.Errorf("%w: the peers' bundle is for %s, this node is %s", bundle.ErrWrongArch, meta.Arch, a.cfg.Arch)
	}
	if len(a.cfg.ApprovedDigests) == 0 && len(a.cfg.TrustedKeys) == 0 {
		return nil
	}
	for _, d := range a.cfg.ApprovedDigests {
		if bundle.NormalizeDigest(d) == digest {
			return nil
		}
	}
	return fmt.Errorf("%w: the peers' bundle %s is not in approved_digests: approve it on every node", bundle.ErrNotApproved, digest)
}

// incomingPath is where a fetched tar lands, under its own name so that
// messages about it read as they would for a stick.
func (a *Agent) incomingPath(r *Record) string {
	return filepath.Join(a.cfg.Paths.StateDir, "incoming", r.ID, r.Name)
}

func (a *Agent) startFetch(ctx context.Context, r *Record) {
	jctx, cancel := context.WithCancel(ctx)
	a.mu.Lock()
	a.busy, a.jobStop = "fetch", cancel
	a.mu.Unlock()
	a.update(r, PhaseFetching, "", Progress{Unit: "bytes"})
	a.log.Info("fetching the bundle from the peers", "phase", string(PhaseFetching), "bundle", r.Name, "digest", r.Digest)
	dest := a.incomingPath(r)
	go func() {
		err := os.MkdirAll(filepath.Dir(dest), 0o700)
		if err == nil {
			p := a.throttle(r, "bytes")
			err = a.deps.Peers.Fetch(jctx, r.Digest, dest, func(pr peer.Progress) { p(pr.Done, pr.Total) })
		}
		a.done <- jobResult{kind: "fetch", rec: r, err: err}
	}()
}

// fetchDone extracts a fetched bundle as if it came from a stick.
func (a *Agent) fetchDone(ctx context.Context, r *Record, err error) {
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		reason := fmt.Sprintf("fetching from the peers failed, retrying: %v", err)
		a.log.Warn("fetch failed", "phase", string(PhaseFetching), "bundle", r.Name, "err", err)
		a.update(r, PhaseFetching, reason, r.Progress)
		a.retryIn(10 * time.Second)
		return
	}
	tarPath := a.incomingPath(r)
	// The fetcher checked the whole digest; the sidecar lets extraction
	// check it again in its own pass.
	sha := strings.TrimSuffix(tarPath, ".tar") + ".sha256"
	line := bundle.FormatSHA256File(r.ID, filepath.Base(tarPath))
	if err := os.WriteFile(sha, []byte(line), 0o600); err != nil {
		a.update(r, PhaseFailed, err.Error(), Progress{})
		return
	}
	src := bundle.Source{Path: tarPath, SHA256Path: sha}
	pol := a.policy
	if len(pol.ApprovedDigests) > 0 || len(pol.TrustedKeys) > 0 {
		pol.ApprovedDigests, pol.TrustedKeys = []string{r.Digest}, nil // approved before the fetch
	}
	a.startExtractWith(ctx, r, src, "", nil, pol)
}

// removeIncoming drops a fetched tar once its bundle is extracted.
func (a *Agent) removeIncoming(r *Record) {
	os.RemoveAll(filepath.Dir(a.incomingPath(r)))
}

// share puts an extracted bundle on the shelf for the peers, with pieces
// if its piece list was hashed in the extraction pass.
func (a *Agent) share(r *Record, pieces *peer.PieceList) {
	if a.deps.Peers == nil || r.Metadata == nil {
		return
	}
	ix, err := bundle.ReadIndex(a.store.IndexPath(r.ID))
	if err != nil {
		a.log.Warn("cannot serve the bundle to peers: no tar index", "bundle", r.Name, "err", err)
		return
	}
	meta, _ := json.Marshal(r.Metadata)
	if err := a.deps.Peers.Share(r.Digest, meta, ix.ReaderAt(r.Dir), ix.Size, pieces); err != nil {
		a.log.Warn("cannot serve the bundle to peers", "bundle", r.Name, "err", err)
	}
}

// peersAgree reports whether every peer holds the same bundle as r, which
// must hold before anything is pinned.
func (a *Agent) peersAgree(r *Record) (bool, string) {
	if a.deps.Peers == nil || len(a.cfg.Peer.Peers) == 0 {
		return true, ""
	}
	a.mu.Lock()
	v := a.view
	a.mu.Unlock()
	if v.at.IsZero() {
		return false, "waiting to hear from the peers"
	}
	var waiting []string
	for _, p := range a.cfg.Peer.Peers {
		st, heard := v.statuses[p]
		switch {
		case !heard:
			waiting = append(waiting, p+" (not heard from yet)")
		case st.Err != nil:
			waiting = append(waiting, p+" (unreachable)")
		case st.Digest != "" && st.Digest != r.Digest && st.Phase != peer.PhaseRejected && st.Phase != peer.PhaseCleaned && st.Phase != peer.PhaseIdle:
			return false, fmt.Sprintf("conflict: node %s holds another bundle (%s, %s): remove the second stick and run 'ferry cleanup' there", nameOf(p, st), st.Version, shortDigest(st.Digest))
		case st.Digest != r.Digest:
			waiting = append(waiting, nameOf(p, st))
		}
	}
	if len(waiting) > 0 {
		return false, "waiting for " + strings.Join(waiting, ", ") + " to hold the bundle"
	}
	return true, ""
}

func nameOf(addr string, st peer.PeerStatus) string {
	if st.Node != "" {
		return st.Node
	}
	return addr
}

// gate moves a loaded node to cluster-ready once every node is loaded with
// the same bundle, and runs the hook once where the stick was plugged.
func (a *Agent) gate(ctx context.Context, r *Record, v view) {
	for _, p := range a.cfg.Peer.Peers {
		if _, heard := v.statuses[p]; !heard {
			return
		}
	}
	d := peer.Decide(a.PeerStatus(), v.statuses)
	if a.deps.Peers == nil || len(a.cfg.Peer.Peers) == 0 {
		d = peer.Decision{Verdict: peer.Ready, Digest: r.Digest}
	}
	switch d.Verdict {
	case peer.Ready:
		if r.Phase != PhaseClusterReady {
			a.update(r, PhaseClusterReady, "", r.Progress)
			a.log.Info("every node holds the bundle, loaded and pinned: the upgrade may proceed", "phase", string(PhaseClusterReady), "bundle", r.Name, "digest", r.Digest)
		}
		if r.Plugged && a.cfg.Cluster.Schedule == "Automatic" && r.Hook == nil {
			// In its own goroutine: a long hook must not stall the loop
			// (and the watchdog with it). It is marked started first.
			a.startHook(ctx, r)
		}
	case peer.Conflict:
		a.reportConflict(d.Reason)
	}
}

// HookRun records the on_ready hook's one run.
type HookRun struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
	Exit     int       `json:"exit"`
	Error    string    `json:"error,omitempty"`
}

// startHook marks the hook started (persisted, so a crash never runs it
// twice) and runs it in the background.
func (a *Agent) startHook(ctx context.Context, r *Record) error {
	if err := a.markHook(r); err != nil {
		return err
	}
	go a.runHook(ctx, r)
	return nil
}

func (a *Agent) markHook(r *Record) error {
	if len(a.cfg.Cluster.OnReady) == 0 {
		return errors.New("no on_ready hook is configured")
	}
	a.mu.Lock()
	if r.Hook != nil {
		a.mu.Unlock()
		return errors.New("the on_ready hook already ran")
	}
	r.Hook = &HookRun{Started: a.deps.Now().UTC()}
	a.mu.Unlock()
	a.save(r, r.Phase, r.Reason, r.Progress)
	return nil
}

// runHook runs on_ready, which markHook marked started.
func (a *Agent) runHook(ctx context.Context, r *Record) error {
	argv := a.cfg.Cluster.OnReady
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "FERRY_RELEASE="+r.Metadata.Release, "FERRY_VERSION="+r.Metadata.Version, "FERRY_DIGEST="+r.Digest)
	out := &logWriter{log: a.log.With("phase", "hook", "bundle", r.Name)}
	cmd.Stdout, cmd.Stderr = out, out
	a.log.Info("running the on_ready hook", "phase", "hook", "bundle", r.Name, "argv", strings.Join(argv, " "))
	err := cmd.Run()
	out.flush()
	a.mu.Lock()
	r.Hook.Finished = a.deps.Now().UTC()
	r.Hook.Exit = cmd.ProcessState.ExitCode()
	if err != nil {
		r.Hook.Error = err.Error()
	}
	phase, reason, prog := r.Phase, r.Reason, r.Progress
	a.mu.Unlock()
	a.save(r, phase, reason, prog)
	if err != nil {
		a.log.Error("the on_ready hook failed", "phase", "hook", "bundle", r.Name, "err", err)
		return fmt.Errorf("on_ready hook: %w", err)
	}
	a.log.Info("the on_ready hook succeeded", "phase", "hook", "bundle", r.Name)
	return nil
}

// proceed runs the hook now (schedule = "Manual"), once the gate is open.
func (a *Agent) proceed(ctx context.Context) error {
	a.mu.Lock()
	r := a.active
	a.mu.Unlock()
	if r == nil || r.Phase != PhaseClusterReady {
		return errors.New("the cluster is not ready: every node must be loaded with the same bundle first (see 'ferry status --cluster')")
	}
	return a.startHook(ctx, r)
}

func (a *Agent) reportConflict(reason string) {
	a.mu.Lock()
	b := a.lastBad
	a.mu.Unlock()
	if b != nil && b.Phase == PhaseConflict && b.Reason == reason {
		return
	}
	a.log.Warn("conflict", "phase", string(PhaseConflict), "reason", reason)
	r := &Record{ID: "conflict-cluster", Name: "cluster", Origin: "peer"}
	a.save(r, PhaseConflict, reason, Progress{})
	a.mu.Lock()
	a.lastBad = r
	a.mu.Unlock()
}

// ClusterStatus is `ferry status --cluster`.
type ClusterStatus struct {
	Self     peer.Status            `json:"self"`
	Peers    map[string]ClusterNode `json:"peers"`
	Decision peer.Decision          `json:"decision"`
}

// ClusterNode is one peer as last polled.
type ClusterNode struct {
	peer.Status
	Unreachable string `json:"unreachable,omitempty"`
}

// Cluster reports every node's phase as last polled.
func (a *Agent) Cluster() ClusterStatus {
	a.mu.Lock()
	v := a.view
	a.mu.Unlock()
	self := a.PeerStatus()
	cs := ClusterStatus{Self: self, Peers: map[string]ClusterNode{}, Decision: peer.Decide(self, v.statuses)}
	for addr, st := range v.statuses {
		n := ClusterNode{Status: st.Status}
		if st.Err != nil {
			n.Unreachable = st.Err.Error()
		}
		cs.Peers[addr] = n
	}
	return cs
}

// logWriter sends a child's output to the log line by line.
type logWriter struct {
	log *slog.Logger
	buf []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		w.log.Info(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

func (w *logWriter) flush() {
	if len(w.buf) > 0 {
		w.log.Info(string(w.buf))
		w.buf = nil
	}
}
