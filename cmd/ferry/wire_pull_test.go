package main

import (
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/internal/digest"
)

// The bundle a follower made is delivered though the agent refused the
// same digest when a peer offered it before the puller published it
// (unfetched); a refusal of the file itself still ends the pull.
func TestDelivered_AnOfferRefusedUnfetchedSaysNothingOfThePulledFile(t *testing.T) {
	d := digest.Digest("sha256:476b733ecc377572695eccad5ebd1647586bf80a64b294a14e7754c7ce6d82dd")
	offer := agent.Record{Digest: d, Origin: agent.OriginPeer, Phase: agent.PhaseRejected, Condition: agent.Condition{Message: "not approved"}}
	file := agent.Record{Digest: d, Origin: agent.OriginFile, Phase: agent.PhaseLoading, Dir: "/var/lib/ferry/upgrade/x"}
	if held, err := delivered(agent.Status{Bundles: []agent.Record{offer}}, d); held || err != nil {
		t.Errorf("only the refused offer: held %v, %v; want waiting", held, err)
	}
	if held, err := delivered(agent.Status{Bundles: []agent.Record{offer, file}}, d); !held || err != nil {
		t.Errorf("the refused offer and the file taken: held %v, %v", held, err)
	}
	file.Phase = agent.PhaseRejected
	if _, err := delivered(agent.Status{Bundles: []agent.Record{offer, file}}, d); err == nil {
		t.Error("the file refused: no error")
	}
}
