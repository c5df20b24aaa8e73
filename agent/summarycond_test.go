package agent

import (
	"github.com/ferry-edge/ferry/agent/machine"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/cluster"
)

// TestAnnotations_PacingsHoldIsInTheNodesReasonAsProgress: the Node's
// reason says that pacing holds the node's bulk work back, and the hold
// coming and going alone is written at the pace of progress, not at once.
func TestAnnotations_PacingsHoldIsInTheNodesReasonAsProgress(t *testing.T) {
	s := machine.Status{Phase: string(machine.PhaseLoading), Reason: machine.ReasonLoading, Message: "loading 3 of 40 images", Healthy: true}
	plain := machine.Annotations(s)
	s.HoldingBack = "io pressure 31%"
	held := machine.Annotations(s)
	if want := "loading 3 of 40 images — holding back for io pressure: the node's other work stalls (pacing)"; held[machine.AnnotationReason] != want {
		t.Errorf("reason %q, want %q", held[machine.AnnotationReason], want)
	}
	if !onlyProgress(held, plain) || !onlyProgress(plain, held) {
		t.Error("the hold alone is written at once, not as progress")
	}
	s.Message = "loading 4 of 40 images"
	if onlyProgress(machine.Annotations(s), held) {
		t.Error("a change of the reason itself is taken for progress")
	}
}

func TestHoldOnly_TellsPacingsHoldFromAChange(t *testing.T) {
	e := cluster.BundleNodeEntry{Phase: string(machine.PhaseLoading), Reason: "loading"}
	held := e
	held.Reason += machine.HeldBack("cpu pressure 91%")
	if !holdOnly(e, held) || !holdOnly(held, e) {
		t.Error("the hold alone is taken for a change")
	}
	moved := held
	moved.Phase = string(machine.PhaseLoaded)
	if holdOnly(e, moved) {
		t.Error("a phase change is taken for the hold alone")
	}
}

// TestSummaryWriter_EveryNodePicksTheSameOneReadyOrNot: a node is held to
// the rule it holds the others to, so that two nodes never both write:
// with neither ready each picks the first by name of those known, with
// one ready each picks that one.
func TestSummaryWriter_EveryNodePicksTheSameOneReadyOrNot(t *testing.T) {
	entry := cluster.BundleNodeEntry{Phase: string(machine.PhaseExtracted)}
	view := cluster.BundleView{Nodes: map[string]cluster.BundleNodeEntry{"a": entry, "b": entry}}
	for _, tc := range []struct {
		ready map[string]cluster.NodeReady
		want  string
	}{
		{map[string]cluster.NodeReady{"a": {}, "b": {}}, "a"},
		{map[string]cluster.NodeReady{"a": {}, "b": {Ready: true}}, "b"},
		{map[string]cluster.NodeReady{"a": {Ready: true}, "b": {Ready: true}}, "a"},
	} {
		for _, self := range []string{"a", "b"} {
			if w := summaryWriter(view, tc.ready, nil, self); w != tc.want {
				t.Errorf("readiness %v, as %s: writer %s, want %s", tc.ready, self, w, tc.want)
			}
		}
	}
}

// TestNodesRead_ReadAgainOnceForANodeItDoesNotKnow: an entry of a node
// the last reading does not know has the readiness read again, once for
// those names (a deleted Node's entry costs one reading, not one a sync).
func TestNodesRead_ReadAgainOnceForANodeItDoesNotKnow(t *testing.T) {
	entry := cluster.BundleNodeEntry{Phase: string(machine.PhaseExtracted)}
	view := cluster.BundleView{Nodes: map[string]cluster.BundleNodeEntry{"a": entry, "c": entry}}
	n := nodesRead{ready: map[string]cluster.NodeReady{"b": {}}, at: time.Now()}
	if u := n.unheard(view, "b"); u != "a" {
		t.Fatalf("unheard %q, want a (c comes after b: never its writer)", u)
	}
	n.readAgainFor(n.unheard(view, "b"))
	if n.ready != nil {
		t.Fatal("not read again for a")
	}
	n.ready = map[string]cluster.NodeReady{"b": {}} // a has no record still
	n.readAgainFor(n.unheard(view, "b"))
	if n.ready == nil {
		t.Error("read again for the same names")
	}
}
