package peer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/internal/digest"
)

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func listFor(data []byte, ps int64) *PieceList {
	p := &PieceList{Digest: digest.Digest("sha256:" + sum(data)), Size: int64(len(data)), PieceSize: ps}
	for off := int64(0); off < p.Size; off += ps {
		p.Pieces = append(p.Pieces, sum(data[off:min(off+ps, p.Size)]))
	}
	return p
}

func TestParsePieceList(t *testing.T) {
	data := bytes.Repeat([]byte("ferry"), 50000) // 250000 bytes: 3 full pieces and a short one
	good := listFor(data, MinPieceSize)
	enc := func(p PieceList) []byte { b, _ := json.Marshal(p); return b }
	tests := []struct {
		name   string
		in     []byte
		digest digest.Digest
		size   int64
		ok     bool
	}{
		{name: "the source's list parses", in: enc(*good), digest: good.Digest, size: good.Size, ok: true},
		{name: "any size when the caller does not know it", in: enc(*good), digest: good.Digest, size: -1, ok: true},
		{name: "a list for another digest is refused", in: enc(*good), digest: digest.Digest("sha256:" + strings.Repeat("0", 64)), size: -1},
		{name: "a list for another size is refused", in: enc(*good), digest: good.Digest, size: good.Size + 1},
		{name: "one piece digest missing is refused", in: enc(PieceList{Digest: good.Digest, Size: good.Size, PieceSize: good.PieceSize, Pieces: good.Pieces[1:]}), digest: good.Digest, size: -1},
		{name: "one piece digest too many is refused", in: enc(PieceList{Digest: good.Digest, Size: good.Size, PieceSize: good.PieceSize, Pieces: append(good.Pieces, good.Pieces[0])}), digest: good.Digest, size: -1},
		{name: "a piece size below the minimum is refused", in: enc(PieceList{Digest: good.Digest, Size: 10, PieceSize: 1, Pieces: make([]string, 10)}), digest: good.Digest, size: -1},
		{name: "uppercase piece digests are refused", in: enc(PieceList{Digest: good.Digest, Size: good.Size, PieceSize: good.PieceSize, Pieces: append([]string{strings.ToUpper(good.Pieces[0])}, good.Pieces[1:]...)}), digest: good.Digest, size: -1},
		{name: "a zero size is refused", in: enc(PieceList{Digest: good.Digest, PieceSize: MinPieceSize}), digest: good.Digest, size: -1},
		{name: "a huge size is refused before allocating", in: []byte(`{"digest":"` + good.Digest + `","size":9223372036854775807,"pieceSize":65536,"pieces":[]}`), digest: good.Digest, size: -1},
		{name: "not JSON is refused", in: []byte("<html>"), digest: good.Digest, size: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParsePieceList(tc.in, tc.digest, tc.size)
			if tc.ok != (err == nil) {
				t.Fatalf("ParsePieceList: err %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrBadPieceList) {
				t.Fatalf("error %v does not wrap ErrBadPieceList", err)
			}
			if err == nil && p.N() != 4 {
				t.Fatalf("N() = %d, want 4", p.N())
			}
		})
	}
}

func TestPieceList_BoundsAndCheck(t *testing.T) {
	data := make([]byte, 3*MinPieceSize+7)
	for i := range data {
		data[i] = byte(i * 7)
	}
	p := listFor(data, MinPieceSize)
	var total int64
	for i := 0; i < p.N(); i++ {
		off, n := p.Bounds(i)
		if off != total {
			t.Fatalf("piece %d starts at %d, want %d", i, off, total)
		}
		if err := p.Check(i, data[off:off+n]); err != nil {
			t.Fatalf("piece %d: %v", i, err)
		}
		total += n
	}
	if total != p.Size {
		t.Fatalf("pieces cover %d bytes, want %d", total, p.Size)
	}
	bad := append([]byte(nil), data[:MinPieceSize]...)
	bad[100] ^= 1
	if err := p.Check(0, bad); !errors.Is(err, ErrBadPiece) {
		t.Fatalf("flipped byte: err %v, want ErrBadPiece", err)
	}
}

func TestHave(t *testing.T) {
	h := NewHave(10)
	for _, i := range []int{0, 7, 8, 9} {
		h.Set(i)
	}
	for i := -1; i <= 11; i++ {
		want := i == 0 || i == 7 || i == 8 || i == 9
		if h.Has(i) != want {
			t.Errorf("Has(%d) = %v, want %v", i, h.Has(i), want)
		}
	}
	if h.Count() != 4 || FullHave(10).Count() != 10 {
		t.Fatalf("Count: %d and %d, want 4 and 10", h.Count(), FullHave(10).Count())
	}
	c := h.Clone()
	c.Set(3)
	if h.Has(3) {
		t.Fatal("Clone shares bits with the original")
	}
	h.Pending = make([]byte, len(h.Bits))
	h.Pending[0] = 1 << 2
	var back Have
	b, _ := json.Marshal(h)
	if err := json.Unmarshal(b, &back); err != nil || !back.valid() || back.Count() != 4 || !back.IsPending(2) || back.IsPending(0) {
		t.Fatalf("JSON round trip: %+v, %v", back, err)
	}
	c = h.Clone()
	c.Pending[0] = 0
	if !h.IsPending(2) {
		t.Fatal("Clone shares pending bits with the original")
	}
	back.Pending = back.Pending[:1]
	if back.valid() {
		t.Fatal("a pending bitmap of the wrong length is valid")
	}
}

// FuzzPieceList checks that whatever a peer sends, an accepted piece list
// is self-consistent: its pieces cover exactly its size.
func FuzzPieceList(f *testing.F) {
	data := bytes.Repeat([]byte{1, 2, 3}, 100000)
	good := listFor(data, MinPieceSize)
	b, _ := json.Marshal(good)
	f.Add(b, int64(len(data)))
	f.Add([]byte(`{"digest":"`+string(good.Digest)+`","size":1,"pieceSize":65536,"pieces":["`+strings.Repeat("0", 64)+`"]}`), int64(1))
	f.Add([]byte(`{"digest":"`+good.Digest+`","size":9223372036854775807,"pieceSize":65536,"pieces":[]}`), int64(-1))
	f.Add([]byte(`{"pieces":null}`), int64(-1))
	f.Add([]byte(`[]`), int64(0))
	f.Fuzz(func(t *testing.T, in []byte, size int64) {
		p, err := ParsePieceList(in, good.Digest, size)
		if err != nil {
			if !errors.Is(err, ErrBadPieceList) {
				t.Fatalf("error %v does not wrap ErrBadPieceList", err)
			}
			return
		}
		var covered int64
		for i := 0; i < p.N(); i++ {
			off, n := p.Bounds(i)
			if off != covered || n <= 0 || n > p.PieceSize {
				t.Fatalf("piece %d: bounds %d+%d after %d bytes", i, off, n, covered)
			}
			covered += n
		}
		if covered != p.Size || (size >= 0 && p.Size != size) {
			t.Fatalf("pieces cover %d bytes of %d (asked %d)", covered, p.Size, size)
		}
	})
}

func TestPieceHasher_AnyWriteSplitGivesThePieceList(t *testing.T) {
	data, digest := randomBundle(t, 3*MinPieceSize+1234)
	want := listFor(data, MinPieceSize)
	for _, step := range []int{1000, MinPieceSize, MinPieceSize + 1, len(data)} {
		ph := NewPieceHasher(MinPieceSize)
		for off := 0; off < len(data); off += step {
			ph.Write(data[off:min(off+step, len(data))])
		}
		got := ph.List(digest)
		if got.Digest != digest || got.Size != int64(len(data)) || got.PieceSize != MinPieceSize || !slices.Equal(got.Pieces, want.Pieces) {
			t.Fatalf("writes of %d bytes: %+v, want %+v", step, got, want)
		}
	}
}

func TestStatuses_ReportsEachPeerOrItsError(t *testing.T) {
	a := newNode(t, ServerOptions{Status: func() Status { return Status{Node: "a", Phase: "loaded"} }}, nil)
	b := newNode(t, ServerOptions{}, nil) // reports no status
	got := NewFetcher(FetcherOptions{Peers: []string{a.addr, b.addr}}).Statuses(t.Context())
	if got[a.addr].Err != nil || got[a.addr].Node != "a" || got[a.addr].Phase != "loaded" {
		t.Fatalf("status of a: %+v", got[a.addr])
	}
	if got[b.addr].Err == nil {
		t.Fatalf("status of b (no status): %+v, want an error", got[b.addr])
	}
}
