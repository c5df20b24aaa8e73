package netns

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/test/fixture"
)

// minisignKey makes a minisign key pair (no password) with the real
// minisign and returns the public and secret key files.
func minisignKey(t *testing.T, name string) (pub, sec string) {
	t.Helper()
	dir := t.TempDir()
	pub, sec = filepath.Join(dir, name+".pub"), filepath.Join(dir, name+".sec")
	if out, err := exec.Command("minisign", "-G", "-W", "-p", pub, "-s", sec).CombinedOutput(); err != nil {
		t.Fatalf("minisign -G: %v\n%s", err, out)
	}
	return pub, sec
}

// TestAgents_ApprovalTravelsBySignature (docs/design.md, "Approval"): a
// bundle approved only by the engineer's signature (no node lists its
// digest) goes from the stick's node to every node, each of which approves
// it by its own trusted_keys, and loads everywhere. With one node that
// trusts another key, that node refuses it saying why, and since every node
// must hold the same bundle before anything is pinned, no node loads it and
// each of the others shows which node refuses it.
func TestAgents_ApprovalTravelsBySignature(t *testing.T) {
	engineerPub, engineerSec := minisignKey(t, "engineer")
	otherPub, _ := minisignKey(t, "other")
	reg := fixture.NewRegistry(t)
	tarPath, meta, digest := realBundle(t, reg, "4.13.7", 3, "--sign-key", engineerSec)
	if _, err := os.Stat(tarPath + ".minisig"); err != nil {
		t.Fatalf("bundle create --sign-key wrote no signature: %v", err)
	}

	t.Run("every node trusts the engineer", func(t *testing.T) {
		f := newFleet(t, fleetOptions{Nodes: 3, CRIO: true, Setup: func(_ *Node, cfg *agent.Config) {
			cfg.TrustedKeys = []string{engineerPub}
			cfg.Approval = "required"
		}})
		f.nodes[0].load(t, tarPath)
		for _, n := range f.nodes {
			n.waitHolds(t, agent.PhaseClusterReady, digest)
			n.checkPinned(t, meta, true)
			s, err := n.A.Status(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range s.Bundles {
				if string(r.Digest) == digest && r.Approval != "signature" {
					t.Errorf("%s approved the bundle by %q", n.Name, r.Approval)
				}
			}
		}
	})

	t.Run("one node trusts another key", func(t *testing.T) {
		f := newFleet(t, fleetOptions{Nodes: 3, CRIO: true, Setup: func(n *Node, cfg *agent.Config) {
			cfg.TrustedKeys = []string{engineerPub}
			cfg.Approval = "required"
			if n.Name == "node2" {
				cfg.TrustedKeys = []string{otherPub}
			}
		}})
		a, b, c := f.nodes[0], f.nodes[1], f.nodes[2]
		a.load(t, tarPath)
		s := c.A.WaitPhase(agentBound, agent.PhaseRejected)
		if s.Reason != agent.ReasonNotApproved {
			t.Fatalf("%s: %s (%s), want %s", c.Name, s.Reason, s.Message, agent.ReasonNotApproved)
		}
		for _, n := range []*anode{a, b} {
			n.A.Wait(agentBound, n.Name+" to show that "+c.Name+" refuses the bundle", func(s agent.Status) bool {
				return s.Phase == string(agent.PhaseExtracted) && string(s.Digest) == digest &&
					s.Reason == agent.ReasonPeerRefuses
			})
		}
		// Every node has seen C refuse it (above, or C itself): turns of
		// their loops after that load nothing anywhere.
		for _, n := range f.nodes {
			n.A.TurnsRefused(2, "proceed")
		}
		for _, n := range f.nodes {
			st, err := n.A.Status(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []agent.Phase{agent.PhaseLoading, agent.PhaseLoaded} {
				if _, ok := st.Times[p]; ok {
					t.Errorf("%s went %s although %s refuses the bundle: %s", n.Name, p, c.Name, st.Line)
				}
			}
			n.checkPinned(t, meta, false)
			if _, err := os.Stat(filepath.Join(n.Cfg.Paths.CRIOConfDir, crio.DropinName)); !os.IsNotExist(err) {
				t.Errorf("%s: ferry's CRI-O drop-in exists (%v)", n.Name, err)
			}
		}
	})
}
