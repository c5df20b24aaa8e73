package peer

import (
	"bytes"
	"testing"
)

func TestEntry_MovesOnlyAsNextAllows(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to entryState
		ok       bool
	}{
		{"HashedBecomesWhole", stateHashing, stateWhole, true},
		{"AWholeBundleThatDiffersBreaks", stateWhole, stateBroken, true},
		{"AFetchedBundleBecomesWhole", stateFetching, stateWhole, true},
		{"AStreamedBundleKeepsItsList", stateFetching, stateListed, true},
		{"AListIsNotWhole", stateListed, stateWhole, false},
		{"ABrokenBundleStaysBroken", stateBroken, stateWhole, false},
		{"ALiveBundleIsReplacedNotMoved", stateLive, stateWhole, false},
		{"AWholeBundleIsNotFetchedAgain", stateWhole, stateFetching, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &entry{state: tc.from, offer: Offer{Complete: tc.from.complete()}}
			if got := e.move(tc.to); got != tc.ok {
				t.Fatalf("move %d → %d = %v, want %v", tc.from, tc.to, got, tc.ok)
			}
			want := tc.from
			if tc.ok {
				want = tc.to
			}
			if e.state != want || e.offer.Complete != want.complete() {
				t.Fatalf("state %d (complete %v), want %d", e.state, e.offer.Complete, want)
			}
		})
	}
}

func TestReceiving_ChangesOnlyItsOwnEntry(t *testing.T) {
	data, digest := randomBundle(t, 3*testPieceSize)
	s := NewShelf(ShelfOptions{PieceSize: testPieceSize})
	t.Cleanup(func() { s.Close() })
	ph := NewPieceHasher(testPieceSize)
	ph.Write(data)
	pl := ph.List(digest)
	h := s.addPartial(Offer{Digest: digest, Size: pl.Size}, bytes.NewReader(data), pl, NewHave(3))
	h.piece(0)
	if have, _ := s.Have(digest); !have.Has(0) || have.Count() != 1 || have.Live {
		t.Fatalf("have %+v, want piece 0", have)
	}
	h.fetched(pl)
	h.complete() // refused: its bytes are gone
	if o := s.Offers(); len(o) != 1 || o[0].Complete {
		t.Fatalf("offers %+v, want one partial", o)
	}
	if have, _ := s.Have(digest); have.Count() != 0 {
		t.Fatalf("a fetched-and-extracted entry holds %d pieces", have.Count())
	}
	// The agent's Add replaces the entry: the old handle changes nothing.
	if err := s.Add(digest, []byte(testMeta), bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	h.drop(0)
	h.cancel()
	s.wg.Wait() // the added bundle checked against the fetched list
	if o := s.Offers(); len(o) != 1 || !o[0].Complete {
		t.Fatalf("offers %+v, want the added bundle, whole", o)
	}
	if p, err := s.Pieces(digest); err != nil || p != pl {
		t.Fatalf("pieces %v, %v: want the fetched list", p, err)
	}
}
