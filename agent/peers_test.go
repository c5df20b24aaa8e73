package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"aead.dev/minisign"
	"github.com/opencontainers/go-digest"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/peer/peertest"
)

// fakePeers is the peer network in memory: offers and statuses the test
// sets, plus whatever linked fakes share (Share on one is an offer to the
// others). It is held to the same suite as the real peers
// (TestFakePeers_ConformsToThePeerSuite).
// ninesDigest is a bundle digest no test makes: another bundle a peer holds.
var ninesDigest = digest.Digest("sha256:" + strings.Repeat("9", 64))

type fakePeers struct {
	mu       sync.Mutex
	offers   []peer.PeerOffer
	statuses map[string]peer.PeerStatus
	tars     map[digest.Digest]string // digest → tar path
	fetched  int
	polls    int // Discover calls: one per poll of the peers
	shared   map[digest.Digest]int64
	held     map[digest.Digest]heldBundle
	pieces   map[digest.Digest]*peer.PieceList
	linked   map[string]*fakePeers // peer address → its fake
	peerList []string
	peersSet bool          // SetPeers was called: only peerList counts
	live     []*peer.Shelf // ShareLive's offers, one shelf each
}

type heldBundle struct {
	meta []byte
	sig  []byte
	r    io.ReaderAt
	size int64
}

func newFakePeers() *fakePeers {
	return &fakePeers{statuses: map[string]peer.PeerStatus{}, tars: map[digest.Digest]string{}, shared: map[digest.Digest]int64{},
		held: map[digest.Digest]heldBundle{}, pieces: map[digest.Digest]*peer.PieceList{}, linked: map[string]*fakePeers{}}
}

// link makes other reachable at addr.
func (f *fakePeers) link(addr string, other *fakePeers) {
	f.mu.Lock()
	f.linked[addr] = other
	f.mu.Unlock()
}

func (f *fakePeers) Share(d digest.Digest, meta, sig []byte, r io.ReaderAt, size int64, pieces *peer.PieceList) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shared[d], f.pieces[d] = size, pieces
	f.held[d] = heldBundle{meta: meta, sig: sig, r: r, size: size}
	return nil
}
func (f *fakePeers) Unshare(d digest.Digest) {
	f.mu.Lock()
	delete(f.shared, d)
	delete(f.held, d)
	f.mu.Unlock()
}
func (f *fakePeers) SetPeers(peers []string) {
	f.mu.Lock()
	f.peerList, f.peersSet = peers, true
	f.mu.Unlock()
}

// reachable reports whether addr is a peer now (locked).
func (f *fakePeers) reachable(addr string) bool {
	return !f.peersSet || slices.Contains(f.peerList, addr)
}

func (f *fakePeers) Discover(context.Context) ([]peer.PeerOffer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.polls++
	out := append([]peer.PeerOffer(nil), f.offers...)
	for addr, o := range f.linked {
		if !f.reachable(addr) {
			continue
		}
		o.mu.Lock()
		for d, b := range o.held {
			out = append(out, peer.PeerOffer{Peer: addr, Offer: peer.Offer{Digest: d, Metadata: b.meta, Size: b.size, Complete: true, Signature: b.sig}})
		}
		for _, sh := range o.live {
			for _, x := range sh.Offers() {
				out = append(out, peer.PeerOffer{Peer: addr, Offer: x})
			}
		}
		o.mu.Unlock()
	}
	return out, nil
}
func (f *fakePeers) Fetch(ctx context.Context, d digest.Digest, dest string, p func(peer.Progress)) error {
	f.mu.Lock()
	src := f.tars[d]
	f.fetched++
	var from *heldBundle
	var live *peer.Shelf
	for addr, o := range f.linked {
		o.mu.Lock()
		if b, ok := o.held[d]; ok && f.reachable(addr) {
			from = &b
		}
		for _, sh := range o.live {
			if _, err := sh.Have(d); err == nil && f.reachable(addr) {
				live = sh
			}
		}
		o.mu.Unlock()
	}
	f.mu.Unlock()
	var b []byte
	var err error
	if from == nil && live != nil {
		from, err = readLive(ctx, live, d)
	}
	switch {
	case err != nil:
	case src != "":
		b, err = os.ReadFile(src)
	case from != nil:
		b = make([]byte, from.size)
		_, err = from.r.ReadAt(b, 0)
	default:
		err = fmt.Errorf("%w: %s", peer.ErrNoPeers, d)
	}
	if err != nil {
		return err
	}
	if p != nil {
		p(peer.Progress{Done: int64(len(b)), Total: int64(len(b))})
	}
	return os.WriteFile(dest, b, 0o600)
}

// FetchStream gets the bytes as Fetch does and streams them into consume.
func (f *fakePeers) FetchStream(ctx context.Context, d digest.Digest, dest string, _ int64, p func(peer.Progress), consume peer.StreamConsumer) (*peer.PieceList, error) {
	if err := f.Fetch(ctx, d, dest, p); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(dest)
	os.Remove(dest)
	if err != nil {
		return nil, err
	}
	if err := consume(bytes.NewReader(b), nil, func(int64, func() []byte) {}); err != nil {
		return nil, err
	}
	h := peer.NewPieceHasher(peer.DefaultPieceSize)
	h.Write(b)
	return h.List(d), nil
}

// readLive waits until the live offer of d on sh has every piece (its
// hasher has read the whole bundle), as a real fetch from it would.
func readLive(ctx context.Context, sh *peer.Shelf, d digest.Digest) (*heldBundle, error) {
	for {
		h, err := sh.Have(d)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", peer.ErrWithdrawn, d, err)
		}
		if h.Count() == h.Pieces {
			r, size, err := sh.Open(d)
			return &heldBundle{r: r, size: size}, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// ShareLive offers the bundle on a shelf of its own, kept in live.
func (f *fakePeers) ShareLive(d digest.Digest, meta, sig []byte, r io.ReaderAt, size int64) (*peer.LiveHasher, error) {
	sh := peer.NewShelf(peer.ShelfOptions{})
	f.mu.Lock()
	f.live = append(f.live, sh)
	f.mu.Unlock()
	return sh.AddLive(d, meta, sig, r, size)
}

func (f *fakePeers) Statuses(context.Context) map[string]peer.PeerStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]peer.PeerStatus{}
	for k, v := range f.statuses {
		if f.reachable(k) {
			out[k] = v
		}
	}
	for addr := range f.linked {
		if _, ok := out[addr]; !ok && f.reachable(addr) {
			out[addr] = peer.PeerStatus{Status: peer.Status{Node: addr}}
		}
	}
	return out
}
func (f *fakePeers) set(addr string, s peer.Status) {
	f.mu.Lock()
	f.statuses[addr] = peer.PeerStatus{Status: s}
	f.mu.Unlock()
}

// The suite's port is the agent's, method for method.
var (
	_ peertest.Peers = Peers(nil)
	_ Peers          = peertest.Peers(nil)
)

func TestFakePeers_ConformsToThePeerSuite(t *testing.T) {
	peertest.Run(t, func(t *testing.T) (peertest.Peers, peertest.Peers, string) {
		src, dst := newFakePeers(), newFakePeers()
		dst.link("10.0.0.9:8090", src)
		return src, dst, "10.0.0.9:8090"
	})
}

// offer makes the fake peer at addr offer the bundle at tarPath.
func (f *fakePeers) offer(t *testing.T, addr, tarPath string, d digest.Digest) {
	m, err := bundle.InspectFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := json.Marshal(m)
	fi, err := os.Stat(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.offers = append(f.offers, peer.PeerOffer{Peer: addr, Offer: peer.Offer{Digest: d, Metadata: mb, Size: fi.Size(), Complete: true}})
	f.tars[d] = tarPath
	f.mu.Unlock()
}

func clusterHarness(t *testing.T) (*harness, *fakePeers) {
	h := newHarness(t, t.TempDir())
	h.cfg.Peer.Peers = []string{"10.0.0.2:8090"}
	h.cfg.Peer.Open = true // no token file in these tests
	p := newFakePeers()
	h.peers = p
	return h, p
}

// waitShared waits for the extracted tree's offer: the snapshot is
// published before the step's effects run, so the offer follows the phase.
func (h *harness) waitShared(p *fakePeers, digest digest.Digest) {
	h.t.Helper()
	h.waitFor("the extracted tree shared", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		_, ok := p.shared[digest]
		return ok
	})
}

// waitPolls waits until the loop has taken n more views of the peers:
// the views go to the loop unbuffered, so once a poll has begun after
// the n-th, the loop has stepped on that view and published its state.
// A deterministic wait for "another poll changed nothing", not a sleep.
func (h *harness) waitPolls(p *fakePeers, n int) {
	h.t.Helper()
	p.mu.Lock()
	target := p.polls + n + 1
	p.mu.Unlock()
	h.waitFor(fmt.Sprintf("%d more polls of the peers", n), func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.polls >= target
	})
}

func TestCluster_FetchesFromPeerThenWaitsForAgreementBeforeLoading(t *testing.T) {
	h, p := clusterHarness(t)
	tarPath, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "extracted", Digest: digest})
	p.offer(t, "10.0.0.2:8090", tarPath, digest)
	h.start()
	s := h.waitPhase(PhaseLoaded)
	if s.Digest != digest {
		t.Fatal(s.Digest)
	}
	p.mu.Lock()
	shared, pieces := p.shared[digest], p.pieces[digest]
	p.mu.Unlock()
	if shared == 0 {
		t.Error("the fetched bundle is not re-served")
	}
	if pieces != nil {
		t.Error("a fetched bundle was shared with a new piece list; the shelf keeps the one it was fetched with")
	}
	if ents, _ := os.ReadDir(filepath.Join(h.cfg.Paths.StateDir, "incoming")); len(ents) != 0 {
		t.Errorf("incoming tar kept: %s", ents[0].Name())
	}
	rec := h.agent.Status()
	if rec.Phase != string(PhaseLoaded) {
		t.Fatal(rec.Phase)
	}
}

// A stick's bundle is shared with the piece list hashed in the extraction
// pass: peers need not wait for a second read of the whole bundle.
func TestCluster_StickBundleIsSharedWithPiecesFromTheExtractionPass(t *testing.T) {
	h, p := clusterHarness(t)
	h.start()
	src, digest := stick(t, bundletest.Options{LayerSize: 12 << 20}) // 12 MiB: 3 pieces
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseExtracted)
	h.waitShared(p, digest)
	tb, err := os.ReadFile(src.Path)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for off := 0; off < len(tb); off += peer.DefaultPieceSize {
		h := sha256.Sum256(tb[off:min(off+peer.DefaultPieceSize, len(tb))])
		want = append(want, hex.EncodeToString(h[:]))
	}
	p.mu.Lock()
	pieces := p.pieces[digest]
	p.mu.Unlock()
	if pieces == nil || !slices.Equal(pieces.Pieces, want) || pieces.PieceSize != peer.DefaultPieceSize || pieces.Size != int64(len(tb)) || pieces.Digest != digest {
		t.Fatalf("shared with piece list %+v, want %d pieces of %d bytes", pieces, len(want), peer.DefaultPieceSize)
	}
}

func TestCluster_TwoDifferentBundlesOfferedIsAConflictAndNothingIsFetched(t *testing.T) {
	h, p := clusterHarness(t)
	h.cfg.Peer.Peers = []string{"10.0.0.2:8090", "10.0.0.3:8090"}
	a, da := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	b, db := bundletest.Write(t, t.TempDir(), bundletest.Options{Version: "4.13.8"})
	p.offer(t, "10.0.0.2:8090", a, da)
	p.offer(t, "10.0.0.3:8090", b, db)
	h.start()
	h.waitPhase(PhaseConflict)
	if s := h.agent.Status(); !strings.Contains(s.Line, "different bundles") {
		t.Fatal(s.Line)
	}
	p.mu.Lock()
	n := p.fetched
	p.mu.Unlock()
	if n != 0 {
		t.Fatalf("fetched %d times", n)
	}
}

func TestCluster_PeerHoldingAnotherBundleBlocksLoading(t *testing.T) {
	h, p := clusterHarness(t)
	h.start()
	src, digest := stick(t, bundletest.Options{})
	p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "extracted", Digest: ninesDigest, Version: "4.13.8"})
	h.plug("/dev/sda", src)
	s := h.waitReason("conflict: node b holds another bundle")
	if s.Phase != string(PhaseExtracted) || s.Digest != digest {
		t.Fatalf("%+v", s)
	}
	if len(h.loader.loads) != 0 {
		t.Fatal("loaded despite the conflict")
	}
}

func TestCluster_GateRunsTheHookOnceWhereTheStickWasPlugged(t *testing.T) {
	h, p := clusterHarness(t)
	marker := filepath.Join(t.TempDir(), "hook.out")
	h.cfg.Cluster.OnReady = []string{"/bin/sh", "-c", `echo "$FERRY_RELEASE" >> ` + marker}
	h.start()
	src, digest := stick(t, bundletest.Options{})
	p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "extracted", Digest: digest})
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseLoaded)
	p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "loaded", Digest: digest})
	h.waitPhase(PhaseClusterReady)
	h.waitFor("the hook run", func() bool { b, _ := os.ReadFile(marker); return len(b) > 0 })
	// Other polls must not run it again: a second run would show in the
	// record (published before its effects) and end before the check.
	h.waitPolls(p, 2)
	h.waitFor("no hook running", func() bool { return hookFinished(h.agent.Status()) })
	b, _ := os.ReadFile(marker)
	if got := strings.Count(string(b), "quay.io/openshift-release-dev/ocp-release@sha256:"); got != 1 {
		t.Fatalf("hook ran %d times: %q", got, b)
	}
	// A restart does not run it again either.
	h.stop()
	h2 := newHarness(t, filepath.Dir(h.cfg.Paths.StateDir))
	h2.cfg = h.cfg
	h2.peers = p
	h2.start()
	h2.waitPhase(PhaseClusterReady)
	h2.waitPolls(p, 2)
	h2.waitFor("no hook running", func() bool { return hookFinished(h2.agent.Status()) })
	b, _ = os.ReadFile(marker)
	if got := strings.Count(string(b), "\n"); got != 1 {
		t.Fatalf("hook ran %d times after a restart", got)
	}
}

func TestCluster_ManualScheduleWaitsForProceed(t *testing.T) {
	h, p := clusterHarness(t)
	marker := filepath.Join(t.TempDir(), "hook.out")
	h.cfg.Cluster.Schedule = "Manual"
	h.cfg.Cluster.OnReady = []string{"/bin/sh", "-c", "echo ran >> " + marker}
	h.start()
	src, digest := stick(t, bundletest.Options{})
	p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "loaded", Digest: digest})
	if err := h.agent.Request(t.Context(), "proceed", nil); err == nil {
		t.Fatal("proceed accepted before the cluster is ready")
	}
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseClusterReady)
	h.waitPolls(p, 2) // the reducer's table proves the rule; here, the wiring
	for _, r := range h.agent.Status().Bundles {
		if r.Hook != nil {
			t.Fatal("Manual schedule ran the hook by itself")
		}
	}
	must(t, h.agent.Request(t.Context(), "proceed", nil))
	h.waitFor("the hook's output", func() bool { b, _ := os.ReadFile(marker); return string(b) == "ran\n" })
	if b, _ := os.ReadFile(marker); string(b) != "ran\n" {
		t.Fatalf("hook output %q", b)
	}
	if err := h.agent.Request(t.Context(), "proceed", nil); err == nil {
		t.Fatal("proceed ran the hook a second time")
	}
}

func TestCluster_UnapprovedPeerBundleIsNotFetched(t *testing.T) {
	h, p := clusterHarness(t)
	h.cfg.ApprovedDigests = []string{"sha256:" + strings.Repeat("1", 64)}
	h.cfg.Approval = "required"
	tarPath, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	p.offer(t, "10.0.0.2:8090", tarPath, digest)
	h.start()
	s := h.waitPhase(PhaseRejected)
	if !strings.Contains(s.Reason, "approved_digests") {
		t.Fatal(s.Reason)
	}
	// It tells its peers which bundle it refused, so that they do not pin it.
	if ps := h.agent.PeerStatus(); ps.Phase != string(PhaseRejected) || ps.Digest != digest || !strings.Contains(ps.Error, "approved_digests") {
		t.Fatalf("peer status %+v", ps)
	}
	p.mu.Lock()
	n := p.fetched
	p.mu.Unlock()
	if n != 0 {
		t.Fatal("fetched an unapproved bundle")
	}
}

// A node that found a conflict still holds its bundle and must keep saying
// which one: a peer that polls it later would otherwise see no bundle there
// and never notice the conflict, and this node's own gate would not either.
func TestCluster_NodeInConflictStillTellsPeersItsBundle(t *testing.T) {
	h, p := clusterHarness(t)
	h.start()
	src, digest := stick(t, bundletest.Options{})
	other := ninesDigest
	p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "extracted", Digest: other, Version: "4.13.8"})
	h.plug("/dev/sda", src)
	h.waitReason("conflict: node b holds another bundle")
	if ps := h.agent.PeerStatus(); ps.Digest != digest || ps.Phase != string(PhaseExtracted) {
		t.Fatalf("peers are told %s %q, want %s %s", ps.Phase, ps.Digest, PhaseExtracted, digest)
	}
	if d := h.agent.Cluster().Decision; d.Verdict != Conflict || len(d.Digests) != 2 {
		t.Fatalf("cluster decision %+v, want a conflict between both bundles", d)
	}
}

func TestCluster_PeerRefusingOurTokenIsShownInStatus(t *testing.T) {
	h, p := clusterHarness(t)
	p.mu.Lock()
	p.statuses["10.0.0.2:8090"] = peer.PeerStatus{Err: fmt.Errorf("10.0.0.2:8090: %w", peer.ErrUnauthorized)}
	p.mu.Unlock()
	h.start()
	h.waitFor("the refusal in the status", func() bool { return !h.agent.Status().Healthy })
	s := h.agent.Status()
	if s.Healthy || !strings.Contains(s.Line, "refuses this node") {
		t.Fatalf("status %+v", s)
	}
}

// The hook ends on its own goroutine while the loop saves the same
// record: the record on disk must always hold the newest state.
func TestCluster_HookEndAndLoopSavesNeverLoseTheNewestRecord(t *testing.T) {
	for i := range 25 {
		h := newHarness(t, t.TempDir())
		h.cfg.Cluster.OnReady = []string{"true"}
		h.start()
		src, digest := stick(t, bundletest.Options{})
		h.plug("/dev/sda", src)
		stop := make(chan struct{})
		go func() { // readers hammer the snapshot meanwhile
			for {
				select {
				case <-stop:
					return
				default:
					_ = h.agent.Status()
					_ = h.agent.Cluster()
				}
			}
		}()
		h.waitPhase(PhaseClusterReady)
		h.waitFor("the hook finished", func() bool { return hookFinished(h.agent.Status()) })
		close(stop)
		h.stop()
		store, err := OpenStore(h.cfg.Paths.StateDir)
		must(t, err)
		recs, err := store.Load()
		must(t, err)
		if len(recs) != 1 || recs[0].Digest != digest || recs[0].Phase != PhaseClusterReady ||
			recs[0].Hook == nil || recs[0].Hook.Finished.IsZero() || recs[0].Hook.Exit != 0 {
			t.Fatalf("iteration %d: record on disk %+v (hook %+v)", i, recs[0], recs[0].Hook)
		}
	}
}

func hookFinished(s Status) bool {
	for _, r := range s.Bundles {
		if r.Hook != nil && !r.Hook.Finished.IsZero() {
			return true
		}
	}
	return false
}

func TestCluster_PeersWithoutATokenAreAConfigMistakeShownInStatus(t *testing.T) {
	h, _ := clusterHarness(t)
	h.cfg.Peer.Open = false
	h.start()
	h.waitFor("the missing token in the status", func() bool {
		s := h.agent.Status()
		return !s.Healthy && strings.Contains(s.Error, "no peer.token_file") && strings.Contains(s.Line, "token_file")
	})
}

// signedOffer makes the fake peer at addr offer the bundle at tarPath with
// a signature by priv, and returns a trusted_keys file for pub.
func signedOffer(t *testing.T, p *fakePeers, addr, tarPath string, digest digest.Digest, priv minisign.PrivateKey) {
	t.Helper()
	f, err := os.Open(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sig, err := bundle.SignReader(priv, f)
	if err != nil {
		t.Fatal(err)
	}
	p.offer(t, addr, tarPath, digest)
	p.mu.Lock()
	p.offers[len(p.offers)-1].Signature = sig
	p.mu.Unlock()
}

func keyFile(t *testing.T, pub minisign.PublicKey) string {
	t.Helper()
	b, err := pub.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "engineer.pub")
	must(t, os.WriteFile(path, b, 0o644))
	return path
}

// Approval travels (docs/design.md, "Approval"): a node whose own trusted_keys
// hold the signer fetches a peer's bundle approved only by signature,
// verifies the signature over the bytes it extracts, loads it and serves
// it on with its signature. A signature by another key, or a trusted key's
// signature of another bundle (its signed comment names the digest), is
// refused before a byte is fetched, saying why.
func TestCluster_ABundleApprovedOnlyBySignatureReachesANodeWithTheKey(t *testing.T) {
	pub, priv, _ := minisign.GenerateKey(nil)
	_, otherPriv, _ := minisign.GenerateKey(nil)
	tarPath, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})

	t.Run("signed by a trusted key", func(t *testing.T) {
		h, p := clusterHarness(t)
		h.cfg.TrustedKeys = []string{keyFile(t, pub)}
		h.cfg.Approval = "required"
		p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "extracted", Digest: digest})
		signedOffer(t, p, "10.0.0.2:8090", tarPath, digest, priv)
		h.start()
		h.waitPhase(PhaseLoaded)
		var rec Record
		for _, r := range h.agent.Status().Bundles {
			if r.Digest == digest {
				rec = r
			}
		}
		if rec.Approval != "signature" || len(rec.Signature) == 0 {
			t.Fatalf("approval %q, signature %d bytes", rec.Approval, len(rec.Signature))
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if !bytes.Equal(p.held[digest].sig, rec.Signature) {
			t.Error("the bundle is served on without its signature")
		}
	})
	t.Run("signed by another key", func(t *testing.T) {
		h, p := clusterHarness(t)
		h.cfg.TrustedKeys = []string{keyFile(t, pub)}
		h.cfg.Approval = "required"
		signedOffer(t, p, "10.0.0.2:8090", tarPath, digest, otherPriv)
		h.start()
		s := h.waitPhase(PhaseRejected)
		if !strings.Contains(s.Reason, "not one of this node's trusted_keys") {
			t.Fatal(s.Reason)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.fetched != 0 {
			t.Fatal("fetched a bundle this node's keys do not approve")
		}
	})
	t.Run("a trusted key's signature of other bytes", func(t *testing.T) {
		h, p := clusterHarness(t)
		h.cfg.TrustedKeys = []string{keyFile(t, pub)}
		h.cfg.Approval = "required"
		other, _ := bundletest.Write(t, t.TempDir(), bundletest.Options{Version: "4.13.9"})
		signedOffer(t, p, "10.0.0.2:8090", other, digest, priv) // the signature of another tar
		p.mu.Lock()
		p.tars[digest] = tarPath
		p.mu.Unlock()
		h.start()
		// The signature names the other tar's digest: refused before a
		// byte is fetched (the key ID alone once let any digest through).
		s := h.waitPhase(PhaseRejected)
		if !strings.Contains(s.Reason, "with a signature of bundle") {
			t.Fatal(s.Reason)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.fetched != 0 || len(h.loader.loads) != 0 {
			t.Fatalf("fetched %d times, loaded %d times", p.fetched, len(h.loader.loads))
		}
	})
}

// A peer whose policy refuses the cluster's bundle blocks loading here:
// every node must hold the same bundle before anything is pinned, and this
// node shows which node refuses it and why.
func TestCluster_APeerThatRefusesTheBundleBlocksLoadingAndIsShown(t *testing.T) {
	h, p := clusterHarness(t)
	h.start()
	src, digest := stick(t, bundletest.Options{})
	why := "rejected upgrade-4.13.7-x86_64.tar: not approved: the peers' bundle is signed by key 1234, which is not one of this node's trusted_keys"
	p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "rejected", Digest: digest, Error: why})
	h.plug("/dev/sda", src)
	s := h.waitReason("node b refuses this bundle")
	if s.Phase != string(PhaseExtracted) || !strings.Contains(s.Reason, "trusted_keys") {
		t.Fatalf("%+v", s)
	}
	h.waitPolls(p, 2) // other peer polls
	if h.loads() != 0 {
		t.Fatal("loaded although a node refuses the bundle")
	}
	// Once that node holds it, loading goes on.
	p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "extracted", Digest: digest})
	h.waitPhase(PhaseLoaded)
}

// A node that refused a peer's bundle by its policy takes it once its
// policy approves it (the administrator added the digest and restarted
// ferry): no cleanup is needed.
func TestCluster_ARefusedPeerBundleIsTakenOnceThePolicyApprovesIt(t *testing.T) {
	h, p := clusterHarness(t)
	h.cfg.ApprovedDigests = []string{"sha256:" + strings.Repeat("1", 64)}
	h.cfg.Approval = "required"
	tarPath, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "extracted", Digest: digest})
	p.offer(t, "10.0.0.2:8090", tarPath, digest)
	h.start()
	h.waitPhase(PhaseRejected)
	h.waitPolls(p, 2) // other polls: still refused, not fetched
	p.mu.Lock()
	n := p.fetched
	p.mu.Unlock()
	if n != 0 {
		t.Fatal("fetched a bundle the policy refuses")
	}
	h.stop()
	h2 := newHarness(t, filepath.Dir(h.cfg.Paths.StateDir))
	h2.cfg = h.cfg
	h2.cfg.ApprovedDigests = append(h2.cfg.ApprovedDigests, string(digest))
	h2.peers = p
	h2.start()
	if s := h2.waitPhase(PhaseLoaded); s.Digest != digest {
		t.Fatal(s.Digest)
	}
}

// A stick's bundle is offered to the peers while it is read, under the
// digest its .sha256 names; the offer ends with the read: replaced by the
// extracted bundle's, with the piece list hashed in the pass, or withdrawn
// when the read ends in a refusal.
func TestCluster_StickOfferedWhileReadThenReplacedOrWithdrawn(t *testing.T) {
	for _, damaged := range []bool{false, true} {
		t.Run(fmt.Sprintf("damaged=%v", damaged), func(t *testing.T) {
			h, p := clusterHarness(t)
			h.start()
			src, digest := stick(t, bundletest.Options{LayerSize: 9 << 20})
			if damaged {
				b, err := os.ReadFile(src.Path)
				if err != nil {
					t.Fatal(err)
				}
				b[len(b)/2] ^= 1
				if err := os.WriteFile(src.Path, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			h.plug("/dev/sda", src)
			if damaged {
				h.waitPhase(PhaseRejected)
			} else {
				h.waitPhase(PhaseExtracted)
				h.waitShared(p, digest)
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			if len(p.live) != 1 {
				t.Fatalf("%d live offers, want one while the stick was read", len(p.live))
			}
			if o := p.live[0].Offers(); len(o) != 0 {
				t.Errorf("the live offer outlived the read: %+v", o)
			}
			_, shared := p.shared[digest]
			if shared == damaged {
				t.Errorf("shared %v after the read, want %v", shared, !damaged)
			}
			if !damaged && (p.pieces[digest] == nil || p.pieces[digest].Partial || p.pieces[digest].Digest != digest) {
				t.Errorf("shared with piece list %+v, want the whole one hashed in the pass", p.pieces[digest])
			}
		})
	}
}
