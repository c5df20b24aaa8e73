package agent

import (
	"encoding/json"
	"github.com/ferry-edge/ferry/agent/machine"
	"testing"
)

// A record saved now loads with its condition whole, and the status
// JSON carries it typed: its reason and kind beside its message, and no
// other copy of the message.
func TestStore_RecordsKeepTheirCondition(t *testing.T) {
	st, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &machine.Record{ID: "new", Name: "upgrade-4.13.7-x86_64.tar", Phase: machine.PhaseExtracted, Retirement: machine.RetirementDone,
		Condition: machine.WaitingFor(machine.ReasonPeersNotHolding, "waiting for node-b to hold the bundle")}
	if err := st.Save(r); err != nil {
		t.Fatal(err)
	}
	recs, err := st.Load()
	if err != nil || len(recs) != 1 || recs[0].Condition != r.Condition || recs[0].Retirement != machine.RetirementDone {
		t.Fatalf("loaded %+v, %v", recs, err)
	}
	b, err := json.Marshal(machine.Status{Bundles: []machine.Record{*r}})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Bundles []map[string]json.RawMessage
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	var cond machine.Condition
	if err := json.Unmarshal(got.Bundles[0]["condition"], &cond); err != nil || cond != r.Condition {
		t.Fatalf("status JSON %s: condition %+v, %v", b, cond, err)
	}
	for _, old := range []string{"reason", "retiring", "retired", "unpinned"} {
		if _, ok := got.Bundles[0][old]; ok {
			t.Errorf("status JSON %s still has the record's %q", b, old)
		}
	}
}
