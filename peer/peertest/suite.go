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
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer"
)

// Peers is the agent's port to the peer network: exactly agent.Peers's
// method set (agent's tests pin both ways at compile time; this package
// must not import agent).
type Peers interface {
	Share(digest digest.Digest, meta, sig []byte, r io.ReaderAt, size int64, pieces *peer.PieceList) error
	Unshare(digest digest.Digest)
	Discover(ctx context.Context) ([]peer.PeerOffer, error)
	Fetch(ctx context.Context, digest digest.Digest, dest string, progress func(peer.Progress)) error
	ShareLive(digest digest.Digest, meta, sig []byte, r io.ReaderAt, size int64) (*peer.LiveHasher, error)
	FetchStream(ctx context.Context, digest digest.Digest, dest string, window int64, progress func(peer.Progress), consume peer.StreamConsumer) (*peer.PieceList, error)
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
	digest := digest.Digest("sha256:" + hex.EncodeToString(sum[:]))
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
	t.Run("AStreamedFetchFeedsTheConsumerEveryByteInOrder", func(t *testing.T) {
		src, dst, _ := pair(t)
		if err := src.Share(digest, meta, sig, bytes.NewReader(data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		var last peer.Progress
		pl, err := dst.FetchStream(t.Context(), digest, filepath.Join(t.TempDir(), "b.part"), 1<<20, func(p peer.Progress) { last = p }, readAll(&got))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), data) {
			t.Fatalf("the consumer read %d bytes that are not the bundle's %d", got.Len(), len(data))
		}
		if last.Done != int64(len(data)) || last.Total != int64(len(data)) {
			t.Fatalf("last progress %+v", last)
		}
		checkList(t, pl, digest, len(data))
	})
	t.Run("AConsumersRefusalIsReturned", func(t *testing.T) {
		src, dst, _ := pair(t)
		if err := src.Share(digest, meta, sig, bytes.NewReader(data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
		refused := errors.New("the tar holds a path outside the bundle")
		_, err := dst.FetchStream(t.Context(), digest, filepath.Join(t.TempDir(), "b.part"), 1<<20, nil, func(r io.Reader, _ *peer.StreamResume, _ peer.Checkpoint) error {
			io.CopyN(io.Discard, r, 1000)
			return refused
		})
		if !errors.Is(err, refused) {
			t.Fatalf("FetchStream = %v, want the consumer's refusal", err)
		}
	})
	t.Run("ALiveBundleIsOfferedWhileHashedStreamedOnceReadAndWithdrawnOnClose", func(t *testing.T) {
		src, dst, addr := pair(t)
		live, err := src.ShareLive(digest, meta, sig, bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		offers, err := dst.Discover(t.Context())
		if err != nil || len(offers) != 1 || offers[0].Digest != digest || offers[0].Peer != addr || offers[0].Complete {
			t.Fatalf("offers of a bundle being read: %+v, %v", offers, err)
		}
		type result struct {
			pl  *peer.PieceList
			err error
		}
		done := make(chan result, 1)
		var got bytes.Buffer
		go func() {
			pl, err := dst.FetchStream(t.Context(), digest, filepath.Join(t.TempDir(), "b.part"), 1<<20, nil, readAll(&got))
			done <- result{pl, err}
		}()
		for off := 0; off < len(data); off += 64 << 10 { // the stick pass
			live.Write(data[off:min(off+64<<10, len(data))])
		}
		var r result
		select {
		case r = <-done:
		case <-time.After(time.Minute):
			t.Fatal("FetchStream from a live source that has read everything did not complete")
		}
		if r.err != nil {
			t.Fatal(r.err)
		}
		if !bytes.Equal(got.Bytes(), data) {
			t.Fatalf("the consumer read %d bytes that are not the bundle's %d", got.Len(), len(data))
		}
		checkList(t, r.pl, digest, len(data))
		live.Close()
		if offers, _ := dst.Discover(t.Context()); len(offers) != 0 {
			t.Fatalf("offers after the live hasher's Close %+v", offers)
		}
	})
	t.Run("AnUnknownDigestIsNotFetched", func(t *testing.T) {
		_, dst, _ := pair(t)
		other := sha256Of(hex.EncodeToString(make([]byte, 32)))
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

// readAll is a consumer that keeps every byte, from the start.
func readAll(out *bytes.Buffer) peer.StreamConsumer {
	return func(r io.Reader, _ *peer.StreamResume, _ peer.Checkpoint) error {
		_, err := io.Copy(out, r)
		return err
	}
}

// checkList fails unless pl is a whole, valid piece list of the bundle.
func checkList(t *testing.T, pl *peer.PieceList, digest digest.Digest, size int) {
	t.Helper()
	if pl == nil || pl.Digest != digest || pl.Size != int64(size) || pl.Partial || pl.Validate() != nil {
		t.Fatalf("piece list %+v, want the whole bundle's", pl)
	}
}

// sha256Of is the digest "sha256:"+hexd, where a digest variable hides
// the package.
func sha256Of(hexd string) digest.Digest { return digest.Digest("sha256:" + hexd) }
