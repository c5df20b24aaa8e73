package machine

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer/wire"
)

// Refused peer offers are kept short and few: a peer offering bundle
// after bundle (500 polls once made one status 98 MB) leaves at most
// maxRefusedOffers records, none with metadata, each reason bounded, and
// they expire after a day.
func TestMaybeFetch_RefusedOffersAreBoundedAndExpire(t *testing.T) {
	m := machineIn(t, PhaseIdle)
	clock := time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)
	m.Now = func() time.Time { return clock }
	big := &bundle.Metadata{Version: "4.13.7", Arch: "aarch64", Release: "quay.io/r@" + heldDigest}
	// 200 images: 18 KiB of metadata an offer, more than the status may
	// hold for all of them (each offer's parse is the test's cost: under
	// -race, 2000 images took 24 s).
	for i := range 200 {
		big.Images = append(big.Images, fmt.Sprintf("quay.io/x/image-%d@%s", i, heldDigest))
	}
	mb, _ := json.Marshal(big)
	var forgotten int
	for i := range 500 {
		clock = clock.Add(time.Second)
		d := fmt.Sprintf("sha256:%064x", i)
		effs := m.MaybeFetch(View{Offers: []wire.PeerOffer{{Peer: "10.0.0.2:8090", Offer: wire.Offer{Digest: digest.Digest(d), Metadata: mb, Signature: make([]byte, 4096)}}}})
		for _, e := range effs {
			if _, ok := e.(EffForget); ok {
				forgotten++
			}
		}
	}
	if len(m.Records) != MaxRefusedOffers || forgotten != 500-MaxRefusedOffers {
		t.Fatalf("%d records kept, %d forgotten; want %d kept", len(m.Records), forgotten, MaxRefusedOffers)
	}
	for _, r := range m.Records {
		if r.Metadata != nil || r.Signature != nil || len(r.Condition.Message) > MaxRefusedReason+len("…") {
			t.Fatalf("a refused offer keeps metadata %v, signature %d bytes, reason %d bytes", r.Metadata != nil, len(r.Signature), len(r.Condition.Message))
		}
	}
	if s, _ := json.Marshal(m.NodeStatus()); len(s) > 16<<10 {
		t.Fatalf("status is %d bytes", len(s))
	}
	clock = clock.Add(RefusedOfferTTL + time.Minute)
	m.PruneRefused()
	if len(m.Records) != 0 || m.LastBad != nil {
		t.Fatalf("%d refused offers kept after a day", len(m.Records))
	}
}

// After extraction the node acts on the metadata.json inside the checked
// tar, not on the probe's (or a peer's) earlier description; a tar whose
// own metadata names another bundle is refused.
func TestExtractDone_TheMetadataInsideTheCheckedTarIsWhatTheNodeActsOn(t *testing.T) {
	inTar := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: "quay.io/r@" + heldDigest, Images: []string{"quay.io/only/the-tar@" + heldDigest}}
	m := machineIn(t, PhaseDetected)
	m.Job = &Job{Kind: JobExtract, ID: "held"}
	m.Step(EvJobDone{Kind: JobExtract, ID: "held", Res: &bundle.Result{Digest: heldDigest, TarSize: 10, Metadata: inTar, Approval: "digest"}})
	if r := m.Records["held"]; r.Metadata != inTar || r.Phase.Active() == false {
		t.Fatalf("record acts on %+v (%s), want the tar's metadata", r.Metadata, r.Phase)
	}

	other := &bundle.Metadata{Version: "4.14.0", Arch: "x86_64", Release: "quay.io/r@" + heldDigest}
	m = machineIn(t, PhaseDetected)
	m.Job = &Job{Kind: JobExtract, ID: "held"}
	m.Step(EvJobDone{Kind: JobExtract, ID: "held", Res: &bundle.Result{Digest: heldDigest, TarSize: 10, Metadata: other, Approval: "digest"}})
	if r := m.Records["held"]; r.Phase != PhaseRejected || r.Condition.Reason != ReasonInvalidBundle {
		t.Fatalf("a tar whose metadata differs from what was read before: %s %q", r.Phase, r.Condition.Message)
	}
}

// A fetch whose write hit ENOSPC is abandoned with a reason, its bytes
// removed, and not retried into the same disk.
func TestFetchDone_ADiskThatFilledUpAbandonsTheFetch(t *testing.T) {
	for name, err := range map[string]error{
		"ENOSPC from the fetch's own write": fmt.Errorf("peer fetch: write x: %w", unix.ENOSPC),
		"the extraction's full disk":        fmt.Errorf("bundle x: %w: %w while extracting y", bundle.ErrNoSpace, bundle.ErrDiskFilled),
	} {
		t.Run(name, func(t *testing.T) {
			m := machineIn(t, PhaseFetching)
			m.Records["held"].Origin = OriginPeer
			m.Job = &Job{Kind: JobFetch, ID: "held"}
			effs := m.Step(EvJobDone{Kind: JobFetch, ID: "held", Err: err})
			removed := 0
			for _, e := range effs {
				switch e := e.(type) {
				case EffRetryIn:
					t.Fatalf("retried in %s", e.After)
				case EffRemove:
					removed++
				}
			}
			r := m.Records["held"]
			if r.Phase != PhaseFailed || r.Condition.Reason != ReasonFetchAbandoned || removed == 0 {
				t.Fatalf("%s %+v, %d removals", r.Phase, r.Condition, removed)
			}
			if effs := m.Step(EvRetry{}); len(effs) != 0 {
				t.Fatalf("a retry tick starts again: %v", effs)
			}
		})
	}
	if !errors.Is(fmt.Errorf("x: %w", unix.EDQUOT), unix.EDQUOT) || !bundle.DiskFilled(fmt.Errorf("x: %w", unix.EDQUOT)) {
		t.Fatal("EDQUOT is a full disk too")
	}
}
