package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/ferry-edge/ferry/agent/machine"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"aead.dev/minisign"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/internal/digest"
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

// The peers, wired: a bundle a peer offers is fetched, re-served,
// loaded once the peer holds it, and the gate opens once it loaded it.
func TestCluster_FetchesFromAPeerThenLoadsAndPassesTheGate(t *testing.T) {
	h, p := clusterHarness(t)
	tarPath, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "extracted", Digest: digest})
	p.offer(t, "10.0.0.2:8090", tarPath, digest)
	h.start()
	s := h.waitPhase(machine.PhaseLoaded)
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
	// The gate: once the peer says it loaded the bundle too, the cluster
	// is ready.
	p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "loaded", Digest: digest})
	h.waitPhase(machine.PhaseClusterReady)
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
		h.waitPhase(machine.PhaseClusterReady)
		h.waitFor("the hook finished", func() bool { return hookFinished(h.agent.Status()) })
		close(stop)
		h.stop()
		store, err := OpenStore(h.cfg.Paths.StateDir)
		must(t, err)
		recs, err := store.Load()
		must(t, err)
		if len(recs) != 1 || recs[0].Digest != digest || recs[0].Phase != machine.PhaseClusterReady ||
			recs[0].Hook == nil || recs[0].Hook.Finished.IsZero() || recs[0].Hook.Exit != 0 {
			t.Fatalf("iteration %d: record on disk %+v (hook %+v)", i, recs[0], recs[0].Hook)
		}
	}
}

func hookFinished(s machine.Status) bool {
	for _, r := range s.Bundles {
		if r.Hook != nil && !r.Hook.Finished.IsZero() {
			return true
		}
	}
	return false
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
