// Package peertest is the conformance suite of the peer transport as the
// agent uses it: run against the real shelf, server and fetcher over HTTP
// and against the agent's in-memory fake, so that what the agent's unit
// tests assume of peers, the real peers do.
package peertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-edge/ferry/peer"
)

// Peers is the agent's view of the peer network (agent.Peers).
type Peers interface {
	Share(digest string, meta, sig []byte, r io.ReaderAt, size int64, pieces *peer.PieceList) error
	Unshare(digest string)
	Discover(ctx context.Context) ([]peer.PeerOffer, error)
	Fetch(ctx context.Context, digest, dest string, progress func(peer.Progress)) error
	Statuses(ctx context.Context) map[string]peer.PeerStatus
	SetPeers(peers []string)
}

// Pair makes two nodes: dst knows src (at srcAddr) as its one peer.
type Pair func(t *testing.T) (src, dst Peers, srcAddr string)

// Run checks a pair of nodes the way the agent drives them.
func Run(t *testing.T, pair Pair) {
	data := make([]byte, 3<<20+123)
	rand.Read(data)
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	meta := []byte(`{"version":"4.13.7","arch":"x86_64"}`)
	sig := []byte("untrusted comment: signature from minisign secret key\nRUQ...\n")

	t.Run("NothingSharedIsNoOffer", func(t *testing.T) {
		_, dst, _ := pair(t)
		offers, _ := dst.Discover(t.Context())
		if len(offers) != 0 {
			t.Fatalf("offers %+v", offers)
		}
	})
	t.Run("ASharedBundleIsOfferedWithItsSignatureFetchedWholeAndUnshared", func(t *testing.T) {
		src, dst, addr := pair(t)
		if err := src.Share(digest, meta, sig, bytes.NewReader(data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
		offers, err := dst.Discover(t.Context())
		if err != nil || len(offers) != 1 || offers[0].Digest != digest || offers[0].Peer != addr || !bytes.Equal(offers[0].Metadata, meta) || !bytes.Equal(offers[0].Signature, sig) {
			t.Fatalf("offers %+v, %v", offers, err)
		}
		dest := filepath.Join(t.TempDir(), "b.tar")
		var last peer.Progress
		if err := dst.Fetch(t.Context(), digest, dest, func(p peer.Progress) { last = p }); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(dest)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("fetched %d bytes, want %d (%v)", len(got), len(data), err)
		}
		if last.Done != int64(len(data)) || last.Total != int64(len(data)) {
			t.Fatalf("last progress %+v", last)
		}
		src.Unshare(digest)
		if offers, _ := dst.Discover(t.Context()); len(offers) != 0 {
			t.Fatalf("offers after unshare %+v", offers)
		}
	})
	t.Run("AnUnknownDigestIsNotFetched", func(t *testing.T) {
		_, dst, _ := pair(t)
		other := "sha256:" + hex.EncodeToString(make([]byte, 32))
		if err := dst.Fetch(t.Context(), other, filepath.Join(t.TempDir(), "x.tar"), func(peer.Progress) {}); err == nil {
			t.Fatal("fetched a bundle no peer has")
		}
	})
	t.Run("EveryPeerHasAStatusOrAnError", func(t *testing.T) {
		_, dst, addr := pair(t)
		st := dst.Statuses(t.Context())
		if _, ok := st[addr]; !ok || len(st) != 1 {
			t.Fatalf("statuses %+v", st)
		}
		dst.SetPeers(nil)
		if st := dst.Statuses(t.Context()); len(st) != 0 {
			t.Fatalf("statuses with no peers %+v", st)
		}
	})
}
