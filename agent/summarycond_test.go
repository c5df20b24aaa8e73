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
	const name = "4.13.7-x86-64"
	for _, tc := range []struct {
		ready map[string]cluster.NodeReady
		want  string
	}{
		{map[string]cluster.NodeReady{"a": {Reports: name}, "b": {Reports: name}}, "a"},
		{map[string]cluster.NodeReady{"a": {Reports: name}, "b": {Ready: true, Reports: name}}, "b"},
		{map[string]cluster.NodeReady{"a": {Ready: true, Reports: name}, "b": {Ready: true, Reports: name}}, "a"},
	} {
		for _, self := range []string{"a", "b"} {
			if w := summaryWriter(name, tc.ready, nil, self); w != tc.want {
				t.Errorf("readiness %v, as %s: writer %s, want %s", tc.ready, self, w, tc.want)
			}
		}
	}
}

// TestSummaryWriter_OnlyANodeThatReportsOnTheBundle: a node whose record
// says it reports on another bundle, or none yet, has no summary of this
// one to write (it may never hold the bundle: no room, another arch), so
// it is passed over, whatever its name; this node counts as reporting.
func TestSummaryWriter_OnlyANodeThatReportsOnTheBundle(t *testing.T) {
	const name = "4.13.7-x86-64"
	ready := map[string]cluster.NodeReady{"a": {Ready: true}, "b": {Ready: true, Reports: "4.13.6-x86-64"}, "c": {Ready: true, Reports: name}, "d": {Ready: true}}
	for self, want := range map[string]string{"a": "a", "c": "c", "d": "c"} {
		if w := summaryWriter(name, ready, nil, self); w != want {
			t.Errorf("as %s: writer %s, want %s", self, w, want)
		}
	}
	if w := summaryWriter(name, ready, map[string]string{"c": "listed in spec.excludedNodes"}, "d"); w != "d" {
		t.Errorf("c excluded, as d: writer %s, want d", w)
	}
}

// TestSummaryNews_CountsAloneWaitAPhaseOrAConditionDoesNot: the summary's
// writer holds back a change of nodesReady, behind or a condition's words
// (summaryEvery), never one of the phase, the approval or a condition's
// status or reason.
func TestSummaryNews_CountsAloneWaitAPhaseOrAConditionDoesNot(t *testing.T) {
	base := cluster.BundleSummary{Phase: "fetching", NodesReady: "0/9", Behind: "a, b", Approved: "digest",
		Conditions: []cluster.BundleCondition{{Type: "Loaded", Status: "False", Reason: "NodesNotLoaded", Message: "0/9 nodes loaded"}}}
	counts := base
	counts.NodesReady, counts.Behind = "1/9", "b"
	counts.Conditions = []cluster.BundleCondition{{Type: "Loaded", Status: "False", Reason: "NodesNotLoaded", Message: "1/9 nodes loaded"}}
	if summaryNews(base, counts) {
		t.Error("a change of the counts alone is news")
	}
	phase := counts
	phase.Phase = "extracted"
	loaded := counts
	loaded.Conditions = []cluster.BundleCondition{{Type: "Loaded", Status: "True", Reason: "AllNodesLoaded", Message: "9/9 nodes loaded"}}
	for what, s := range map[string]cluster.BundleSummary{"the phase": phase, "a condition's status": loaded} {
		if !summaryNews(base, s) {
			t.Errorf("a change of %s is not news", what)
		}
	}
}

// TestNodesRead_AWriterTakesItsTurnAfterTheNodesBeforeIt: the summary's
// writer by the rule whose record does not say so yet writes at once
// when no ready node comes before it by name, else after writerStagger
// for each (an excluded or not ready node takes no turn): the record of
// an earlier node that reports comes in meanwhile, and only one node
// writes its record to say it reports.
func TestNodesRead_AWriterTakesItsTurnAfterTheNodesBeforeIt(t *testing.T) {
	const name = "4.13.7-x86-64"
	t0 := time.Date(2026, 11, 29, 4, 0, 0, 0, time.UTC)
	n := nodesRead{ready: map[string]cluster.NodeReady{"a": {Ready: true}, "b": {Ready: true}, "c": {Ready: true}, "d": {}}}
	if !n.takesTurn(name, "a", nil, t0) {
		t.Fatal("a, first by name, waits")
	}
	n.notWriter()
	if n.takesTurn(name, "d", map[string]string{"a": "listed in spec.excludedNodes"}, t0) {
		t.Fatal("d writes at once with b and c ready before it")
	}
	if want := t0.Add(2 * writerStagger); !n.wakeAt.Equal(want) {
		t.Fatalf("d's turn at %s, want %s (b, c: a is excluded)", n.wakeAt, want)
	}
	if n.takesTurn(name, "d", map[string]string{"a": "listed in spec.excludedNodes"}, t0.Add(2*writerStagger-time.Millisecond)) {
		t.Fatal("d writes before its turn")
	}
	if !n.takesTurn(name, "d", map[string]string{"a": "listed in spec.excludedNodes"}, t0.Add(2*writerStagger)) || !n.wakeAt.IsZero() {
		t.Fatal("d does not write at its turn")
	}
	if n.takesTurn("other", "d", nil, t0.Add(time.Hour)) {
		t.Fatal("another bundle's turn starts over")
	}
	// None ready (the rule takes the first of those known): every node
	// before it by name takes a turn.
	none := nodesRead{ready: map[string]cluster.NodeReady{"a": {}, "b": {}, "c": {}}}
	if none.takesTurn(name, "c", nil, t0); !none.wakeAt.Equal(t0.Add(2 * writerStagger)) {
		t.Fatalf("c, none ready: its turn at %s, want after a's and b's", none.wakeAt)
	}
}
