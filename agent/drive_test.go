package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/ferry-edge/ferry/agent/machine"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"aead.dev/minisign"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/imagepolicy"
	"github.com/ferry-edge/ferry/internal/imagetree"
	"github.com/ferry-edge/ferry/peer"
)

// The jobs tested with the reducer, the loop turned by hand: the agent is
// built (New) but never Run, and drive does on the test's goroutine what
// the loop's turn does: step, publish, perform. A probe, a job or a hook
// runs to its end there and the event it ends with (after what it posted
// meanwhile, as the loop would take them) is stepped in turn, until none
// is left. No goroutine of the agent's runs; a retry is recorded, not
// timed; the peers' view comes when the test polls (poll).

// boot does what Run does before its loop: the records from disk, the
// interrupted extractions removed, the start.
func (h *harness) boot() {
	h.t.Helper()
	h.agent = h.newAgent()
	h.agent.life = h.t.Context()
	recs, err := h.agent.store.Load()
	must(h.t, err)
	h.agent.removeStaging(recs)
	h.drive(machine.EvStart{Records: recs})
}

// drive steps ev and everything that follows from it.
func (h *harness) drive(ev machine.Event) {
	h.t.Helper()
	a, ctx := h.agent, h.t.Context()
	queue := []machine.Event{ev}
	// then queues what a background task posted, then its own end.
	then := func(end machine.Event) {
		for {
			select {
			case posted := <-a.events:
				queue = append(queue, posted)
				continue
			case <-a.progress:
				continue
			default:
			}
			break
		}
		queue = append(queue, end)
	}
	for len(queue) > 0 {
		ev := queue[0]
		queue = queue[1:]
		effs := a.m.Step(ev)
		a.publish()
		for _, e := range effs {
			switch e := e.(type) {
			case machine.EffProbe:
				then(a.probe(ctx, e))
			case machine.EffStartJob:
				e.Rec = e.Rec.Clone()
				then(a.runJob(ctx, e))
			case machine.EffRunHook:
				then(a.runHook(ctx, e.Rec.Clone()))
			case machine.EffRetryIn:
				h.retries = append(h.retries, e.After)
			case machine.EffAskUpgrade:
				h.asked++ // the ask's retries are the wiring's (TestUpgrade_AnUnreachableAPIIsRetriedAndNothingIsLost)
			case machine.EffResumeLoader:
				must(h.t, a.deps.Loader.Resume(ctx, e.Rec.Metadata, e.Rec.Images(), e.Rec.Dir, e.Keep))
			default:
				a.perform(ctx, e)
			}
		}
		a.announce()
	}
}

// plugNow plugs a stick holding srcs and drives what follows.
func (h *harness) plugNow(dev string, srcs ...bundle.Source) {
	h.t.Helper()
	h.media.mu.Lock()
	h.media.sticks[dev] = srcs
	h.media.mu.Unlock()
	h.drive(machine.EvDevice{DeviceEvent: machine.DeviceEvent{Action: "add", Device: dev, FSType: "vfat"}})
}

// poll gives the machine one view of the peers, as pollPeers takes it.
func (h *harness) poll(p Peers) {
	h.t.Helper()
	offers, _ := p.Discover(h.t.Context())
	h.drive(machine.EvView{View: machine.View{Offers: offers, Statuses: p.Statuses(h.t.Context()), At: harnessClock}})
}

// ask sends a request from the local socket and returns its answer.
func (h *harness) ask(kind machine.RequestKind) error {
	h.t.Helper()
	id, reply := h.agent.handles.addReply()
	h.drive(machine.EvRequest{Kind: kind, Reply: id})
	select {
	case err := <-reply:
		return err
	default:
		h.t.Fatalf("%v: not answered", kind)
		return nil
	}
}

func TestJobs_ImageTheNodesPolicyAdmitsByDigestOnlyIsLoadedWithoutItsTag(t *testing.T) {
	// The node's policy.json wants a sigstore signature under
	// matchRepoDigestOrExact; the app's names another tag of the same
	// manifest: by digest it passes, by its tag 1.0 it does not.
	key, pub := imagetree.NewSigningKey()
	dir := t.TempDir()
	keyPath, policyPath := filepath.Join(dir, "app.pub"), filepath.Join(dir, "policy.json")
	must(t, os.WriteFile(keyPath, pub, 0o644))
	must(t, os.WriteFile(policyPath, []byte(`{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{
  "quay.io/team/app":[{"type":"sigstoreSigned","keyPath":"`+keyPath+`","signedIdentity":{"type":"matchRepoDigestOrExact"}}]}}}`), 0o644))
	app := bundletest.Ref("quay.io/team/app:1.0", 0)
	h := newHarness(t, t.TempDir())
	h.admit = imagepolicy.Checker{Path: policyPath}.Admit
	h.boot()
	src, _ := stick(t, bundletest.Options{Images: []string{"quay.io/team/app:1.0"}, SignKey: key, SignAll: true,
		SignIdentity: func(ref string) string {
			if ref == app {
				return "quay.io/team/app:2.0"
			}
			return ""
		}})
	h.plugNow("/dev/sda", src)
	s := h.agent.Status()
	if s.Phase != string(machine.PhaseClusterReady) {
		t.Fatalf("status %+v", s)
	}
	name, _, digest := bundle.SplitRef(app)
	if len(h.loader.images) != 1 || !slices.Contains(h.loader.images[0], name+"@"+digest) || slices.Contains(h.loader.images[0], app) {
		t.Fatalf("loaded %q, want %s by digest only", h.loader.images, app)
	}
	if refs := bundle.PullRefs(h.loader.images[0]); slices.Contains(refs, "quay.io/team/app:1.0") || !slices.Contains(refs, name+"@"+digest) {
		t.Errorf("pulls %q: want the digest and not the tag", refs)
	}
	if len(s.SignaturePolicy) != 1 || !strings.Contains(s.SignaturePolicy[0], "quay.io/team/app:1.0 is loaded by digest only") ||
		!strings.Contains(s.SignaturePolicy[0], "so the tag 1.0 is not loaded") {
		t.Errorf("status warnings %q, want the tag dropped said", s.SignaturePolicy)
	}
	if len(s.Bundles) != 1 || !slices.Equal(s.Bundles[0].DigestOnly, []string{app}) {
		t.Errorf("record %+v, want %s by digest only kept", s.Bundles, app)
	}
}

func TestJobs_AStickForAnotherArchIsRejected(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.boot()
	src, _ := stick(t, bundletest.Options{Arch: "aarch64"})
	h.plugNow("/dev/sda", src)
	if r := h.agent.m.LastBad; r == nil || r.Phase != machine.PhaseRejected || r.Condition.Reason != machine.ReasonWrongArchitecture || !strings.Contains(r.Condition.Message, "aarch64") {
		t.Fatalf("refusal %+v", r)
	}
}

// No room for a stick's bundle and its load: refused before a byte is
// written, with the loader's words; a peer's bundle is not fetched, and
// the fetch is retried (space may be freed), the room asked for counting
// its tar and its tree; a fetched bundle with no room left to extract it
// (the disk filled meanwhile) is fetched again, not refused for good.
func TestJobs_NoRoomRefusesBeforeWriting(t *testing.T) {
	noRoom := fmt.Errorf("%w in /var: writing the bundle (1 GiB) and loading the 1 images CRI-O does not hold needs 3 GiB; free 2 GiB there", bundle.ErrNoSpace)
	t.Run("a stick", func(t *testing.T) {
		h := newHarness(t, t.TempDir())
		h.loader.room = noRoom
		h.boot()
		src, _ := stick(t, bundletest.Options{})
		h.plugNow("/dev/sda", src)
		r := h.record()
		if r.Phase != machine.PhaseRejected || r.Condition.Reason != machine.ReasonNotEnoughSpace || !strings.Contains(r.Condition.Message, noRoom.Error()) {
			t.Fatalf("record %s %+v", r.Phase, r.Condition)
		}
		if ents, _ := os.ReadDir(h.cfg.Paths.ExtractDir); len(ents) != 0 {
			t.Fatalf("wrote %s", ents[0].Name())
		}
	})
	for _, tc := range []struct {
		name   string
		serial bool
		// state is the room asked for in the state dir, given the tree's.
		state func(tree int64) int64
		what  string
	}{
		{name: "a peer's bundle, fetched whole (serial)", serial: true, state: func(tree int64) int64 { return tree }, what: "the tar"},
		{name: "a peer's bundle, cut-through: its tree and a window", state: peer.StreamWindow, what: "the window"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, p := clusterHarness(t)
			h.cfg.Peer.Serial = tc.serial
			var asked map[string]int64
			h.loader.roomFor = func(w map[string]int64) error { asked = w; return noRoom }
			tarPath, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})
			p.offer(t, "10.0.0.2:8090", tarPath, digest)
			h.boot()
			h.poll(p)
			r := h.record()
			if r.Phase != machine.PhaseFetching || r.Condition.Reason != machine.ReasonNoRoomToExtract || !strings.Contains(r.Condition.Message, noRoom.Error()) ||
				!slices.Equal(h.retries, []time.Duration{10 * time.Second}) {
				t.Fatalf("record %s %+v, retries %v", r.Phase, r.Condition, h.retries)
			}
			tree := asked[h.cfg.Paths.ExtractDir]
			if len(asked) != 2 || tree <= 0 || asked[h.cfg.Paths.StateDir] != tc.state(tree) {
				t.Errorf("room asked for %v: want %s (%d) in %s and the tree in %s", asked, tc.what, tc.state(tree), h.cfg.Paths.StateDir, h.cfg.Paths.ExtractDir)
			}
			if p.fetched != 0 {
				t.Fatal("fetched without room")
			}
		})
	}
	t.Run("a fetched bundle, the disk filled meanwhile", func(t *testing.T) {
		h, p := clusterHarness(t)
		h.cfg.Peer.Serial = true // the extraction's own check comes after a whole fetch
		h.loader.roomFor = func(w map[string]int64) error {
			if len(w) == 1 { // the extraction
				return noRoom
			}
			return nil
		}
		tarPath, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})
		p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "extracted", Digest: digest})
		p.offer(t, "10.0.0.2:8090", tarPath, digest)
		h.boot()
		h.poll(p)
		if r := h.record(); r.Phase != machine.PhaseFetching || r.Condition.Reason != machine.ReasonNoRoomToExtract || !strings.Contains(r.Condition.Message, noRoom.Error()) {
			t.Fatalf("record %s %+v", r.Phase, r.Condition)
		}
		if ents, _ := os.ReadDir(filepath.Join(h.cfg.Paths.StateDir, "incoming")); len(ents) != 0 {
			t.Errorf("the tar was kept: %s", ents[0].Name())
		}
		// Space freed; the retry fetches and loads it.
		h.loader.roomFor = nil
		h.drive(machine.EvRetry{})
		h.poll(p)
		if s := h.agent.Status(); s.Phase != string(machine.PhaseLoaded) || s.Digest != digest {
			t.Fatalf("status %+v", s)
		}
		if p.fetched != 2 {
			t.Errorf("fetched %d times, want 2", p.fetched)
		}
	})
}

// A stick whose bundle its files make unreadable (Refused: a link, a
// FIFO) is rejected with that reason and nothing opened; what a stick
// controls (its file names, in the reason) leaves the node as one
// bounded line (the status, the STATUS= line, the peers' status, the
// Node's annotation), and the device is probed again when plugged again.
func TestJobs_RefusedStickFileIsRejectedWithASanitisedReason(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.api = newFakeAPI()
	h.boot()
	evil := "upgrade-1.0-x86_64.sha256\nSTATUS=all good\x1b[2J" + strings.Repeat("x", 2*machine.MaxReason)
	why := fmt.Errorf("unsafe file on the stick: %s: it is a symbolic link: copy the file itself onto the stick", evil)
	h.plugNow("/dev/sda", bundle.Source{Path: "", Label: "/run/ferry/media/sda-1/upgrade-1.0-x86_64.tar", Refused: why})
	s := h.agent.Status()
	if s.Phase != string(machine.PhaseRejected) || s.Bundle != "upgrade-1.0-x86_64.tar" || s.Reason != machine.ReasonRefused {
		t.Fatalf("status %+v", s)
	}
	// The refusal's words are the product here: what the stick's author
	// controls must leave sanitised, bounded, and still say what to fix.
	ann := machine.Annotations(s)[machine.AnnotationReason]
	for what, v := range map[string]string{"message": s.Message, "line": s.Line, "peer error": h.agent.PeerStatus().Error, "annotation": ann} {
		if !strings.Contains(v, "unsafe file") || strings.ContainsAny(v, "\n\x1b") || len(v) > 2*machine.MaxReason {
			t.Errorf("%s not the reason, sanitised: %q", what, v)
		}
	}
	if len(s.Message) > machine.MaxReason || len(ann) > machine.MaxReason || !strings.Contains(s.Message, "…") || !strings.HasSuffix(s.Message, "copy the file itself onto the stick") {
		t.Errorf("message not bounded: %d bytes", len(s.Message))
	}
	if !slices.ContainsFunc(h.lines.all, func(l string) bool { return strings.Contains(l, "unsafe file on the stick") }) {
		t.Fatal("no STATUS= line says why")
	}
	for _, l := range h.lines.all {
		if strings.ContainsAny(l, "\n\x1b") {
			t.Errorf("STATUS= line %q holds a newline or a control character", l)
		}
	}
	if h.media.opened() != 0 {
		t.Error("the refused stick left mounted")
	}

	// The slot is not stuck: a good stick in it is read.
	src, digest := stick(t, bundletest.Options{})
	h.plugNow("/dev/sda", src)
	if s := h.agent.Status(); s.Bundle != "upgrade-4.13.7-x86_64.tar" || s.Digest != digest {
		t.Fatalf("the good stick plugged next was not read: %+v", s)
	}
}

// A stick's bundle is offered to the peers while it is read, under the
// digest its .sha256 names; the offer ends with the read: replaced by the
// extracted bundle's, shared with the piece list hashed in that pass
// (peers need not wait for a second read), or withdrawn when the read
// ends in a refusal.
func TestJobs_StickOfferedWhileReadThenSharedWithItsPiecesOrWithdrawn(t *testing.T) {
	for _, damaged := range []bool{false, true} {
		t.Run(fmt.Sprintf("damaged=%v", damaged), func(t *testing.T) {
			h, p := clusterHarness(t)
			h.boot()
			src, digest := stick(t, bundletest.Options{LayerSize: 12 << 20}) // 12 MiB: 3 pieces
			tb, err := os.ReadFile(src.Path)
			must(t, err)
			if damaged {
				b := slices.Clone(tb)
				b[len(b)/2] ^= 1
				must(t, os.WriteFile(src.Path, b, 0o644))
			}
			h.plugNow("/dev/sda", src)
			if want := map[bool]machine.Phase{false: machine.PhaseExtracted, true: machine.PhaseRejected}[damaged]; h.record().Phase != want {
				t.Fatalf("record %+v, want %s", h.record(), want)
			}
			if len(p.live) != 1 {
				t.Fatalf("%d live offers, want one while the stick was read", len(p.live))
			}
			if o := p.live[0].Offers(); len(o) != 0 {
				t.Errorf("the live offer outlived the read: %+v", o)
			}
			if _, shared := p.shared[digest]; shared == damaged {
				t.Errorf("shared %v after the read, want %v", shared, !damaged)
			}
			if damaged {
				return
			}
			var want []string
			for off := 0; off < len(tb); off += peer.DefaultPieceSize {
				h := sha256.Sum256(tb[off:min(off+peer.DefaultPieceSize, len(tb))])
				want = append(want, hex.EncodeToString(h[:]))
			}
			pieces := p.pieces[digest]
			if pieces == nil || pieces.Partial || !slices.Equal(pieces.Pieces, want) || pieces.PieceSize != peer.DefaultPieceSize ||
				pieces.Size != int64(len(tb)) || pieces.Digest != digest {
				t.Fatalf("shared with piece list %+v, want %d pieces of %d bytes", pieces, len(want), peer.DefaultPieceSize)
			}
		})
	}
}

// Approval travels (docs/design.md, "Approval"): a node whose own trusted_keys
// hold the signer fetches a peer's bundle approved only by signature,
// verifies the signature over the bytes it extracts, loads it and serves
// it on with its signature. A signature by another key, or a trusted key's
// signature of another bundle (its signed comment names the digest), is
// refused before a byte is fetched.
func TestJobs_ABundleApprovedOnlyBySignatureReachesANodeWithTheKey(t *testing.T) {
	pub, priv, _ := minisign.GenerateKey(nil)
	_, otherPriv, _ := minisign.GenerateKey(nil)
	tarPath, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	other, _ := bundletest.Write(t, t.TempDir(), bundletest.Options{Version: "4.13.9"})
	for _, tc := range []struct {
		name   string
		signed string // the tar the signature is of
		key    minisign.PrivateKey
		ok     bool
	}{
		{"signed by a trusted key", tarPath, priv, true},
		{"signed by another key", tarPath, otherPriv, false},
		// The signature names the other tar's digest (the key ID alone
		// once let any digest through).
		{"a trusted key's signature of other bytes", other, priv, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, p := clusterHarness(t)
			h.cfg.TrustedKeys = []string{keyFile(t, pub)}
			h.cfg.Approval = "required"
			p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "extracted", Digest: digest})
			signedOffer(t, p, "10.0.0.2:8090", tc.signed, digest, tc.key)
			p.tars[digest] = tarPath
			h.boot()
			h.poll(p)
			if !tc.ok {
				if r := h.agent.m.LastBad; r == nil || r.Phase != machine.PhaseRejected || r.Condition.Reason != machine.ReasonNotApproved || p.fetched != 0 || len(h.loader.loads) != 0 {
					t.Fatalf("refusal %+v; fetched %d times, loaded %d times", r, p.fetched, len(h.loader.loads))
				}
				return
			}
			rec := h.record()
			if rec.Phase != machine.PhaseLoaded || rec.Approval != bundle.ApprovalSignature || len(rec.Signature) == 0 {
				t.Fatalf("record %s, approval %q, signature %d bytes", rec.Phase, rec.Approval, len(rec.Signature))
			}
			if !bytes.Equal(p.held[digest].sig, rec.Signature) {
				t.Error("the bundle is served on without its signature")
			}
		})
	}
}

// Cleanup before loading, asked on the node or in the UpgradeBundle's
// spec, removes the extracted tree and leaves the node free for the next
// bundle; the resource says cleaned.
func TestJobs_CleanupBeforeLoadingTakesTheBundleOut(t *testing.T) {
	for _, fromSpec := range []bool{false, true} {
		t.Run(fmt.Sprintf("fromSpec=%v", fromSpec), func(t *testing.T) {
			h, _ := clusterHarness(t) // the peer never answers: the bundle stays extracted
			h.cfg.Approval = "required"
			h.api = newFakeAPI()
			h.boot()
			src, _ := stick(t, bundletest.Options{})
			h.plugNow("/dev/sda", src)
			if r := h.record(); r.Phase != machine.PhaseExtracted || r.Condition.Reason != machine.ReasonAwaitingApproval {
				t.Fatalf("record %s %+v", r.Phase, r.Condition)
			}
			if fromSpec {
				h.drive(machine.EvCluster{Policy: &machine.PolicyRead{Name: resourceName, Policy: cluster.BundlePolicy{Cleanup: true}}})
			} else {
				must(t, h.ask(machine.ReqCleanup))
			}
			if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64")); !os.IsNotExist(err) {
				t.Fatalf("extracted dir kept: %v", err)
			}
			if s := h.agent.Status(); s.Phase != string(machine.PhaseIdle) || h.record().Phase != machine.PhaseCleaned || h.loads() != 0 {
				t.Fatalf("after cleanup %+v, %d loads", s, h.loads())
			}
			if rep := h.agent.snap.Load().bundle; rep == nil || rep.Entry.Phase != string(machine.PhaseCleaned) {
				t.Fatalf("the UpgradeBundle report %+v, want cleaned", rep)
			}
			next, _ := stick(t, bundletest.Options{Version: "4.13.8"})
			h.plugNow("/dev/sdb", next)
			if s := h.agent.Status(); s.Phase != string(machine.PhaseExtracted) || s.Version != "4.13.8" {
				t.Fatalf("the next bundle: %+v", s)
			}
		})
	}
}

// The cluster's preflight, before a plugged bundle is read: a refusal
// rejects it unread, with the warnings found beside it shown (status and
// UpgradeBundle report); warnings alone, or an API that cannot be asked,
// do not block.
func TestJobs_PreflightBeforeTheStickIsRead(t *testing.T) {
	refusal := "the cluster is not upgradeable to a new minor version (Upgradeable=False, AdminAckRequired): Kubernetes 1.27 removes APIs in use"
	warnings := []string{"workloads pull with imagePullPolicy Always an image the bundle does not carry, and fail to start if restarted without a registry: shop/front/main (quay.io/my-company/front:latest)",
		"machine config pool worker is paused: …"}
	unreachable := errors.New("the cluster's API at https://api:6443 cannot be reached")
	for _, tc := range []struct {
		name  string
		pre   cluster.Preflight
		err   error
		phase machine.Phase
		warns []string // what the status shows; nil: the API's error, once
	}{
		{"a refusal", cluster.Preflight{Current: "4.13.7", Refusals: []string{"at 4.13.7 already"}}, nil, machine.PhaseRejected, []string{}},
		{"a refusal beside warnings", cluster.Preflight{Current: "4.12.9", Refusals: []string{refusal}, Warnings: warnings}, nil, machine.PhaseRejected, warnings},
		{"warnings", cluster.Preflight{Current: "4.13.6", Warnings: warnings[1:]}, nil, machine.PhaseClusterReady, warnings[1:]},
		{"an API that cannot be asked", cluster.Preflight{}, unreachable, machine.PhaseClusterReady, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, api := apiHarness(t)
			api.pre, api.preErr = tc.pre, tc.err
			h.boot()
			src, _ := stick(t, bundletest.Options{})
			h.plugNow("/dev/sda", src)
			s, r := h.agent.Status(), h.record()
			if r.Phase != tc.phase || !slices.Equal(api.preAsked, []string{"4.13.7"}) {
				t.Fatalf("record %s %+v; preflight asked about %v", r.Phase, r.Condition, api.preAsked)
			}
			switch {
			case tc.warns == nil:
				if len(s.Preflight) != 1 || !strings.Contains(s.Preflight[0], unreachable.Error()) {
					t.Fatalf("warnings %q", s.Preflight)
				}
			case !slices.Equal(s.Preflight, tc.warns) && len(s.Preflight)+len(tc.warns) > 0:
				t.Fatalf("warnings %q, want %q", s.Preflight, tc.warns)
			}
			if tc.phase != machine.PhaseRejected {
				return
			}
			if r.Condition.Reason != machine.ReasonPreflightRefused || !strings.Contains(r.Condition.Message, machine.ErrPreflight.Error()) ||
				!strings.Contains(r.Condition.Message, tc.pre.Refusals[0]) {
				t.Fatalf("condition %+v", r.Condition)
			}
			want := tc.pre.Warnings
			if h.cfg.ApprovalOff() { // the node's standing warning, said once in the summary
				want = append(slices.Clone(want), machine.ApprovalOffWarning)
			}
			if rep := h.agent.snap.Load().bundle; rep == nil || !slices.Equal(rep.Sum.Warnings, want) {
				t.Fatalf("the UpgradeBundle report %+v, want the warnings %q", rep, want)
			}
			if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64")); !errors.Is(err, os.ErrNotExist) || h.loads() != 0 {
				t.Errorf("extracted or loaded although refused: %v, %d loads", err, h.loads())
			}
		})
	}
}

// What a crash mid-extraction leaves, a staging dir, is removed at start
// (the record's published dir is the reducer's: its table, "a restart
// mid-copy removes the dir and waits for the stick"); a bundle being
// fetched cut-through keeps its own, to resume from.
func TestRemoveStaging_DropsInterruptedExtractionsButAFetchsOwn(t *testing.T) {
	h := newHarness(t, t.TempDir())
	a := h.newAgent()
	stuck, fetching := filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64"), filepath.Join(h.cfg.Paths.ExtractDir, "4.13.8-x86_64")
	for _, d := range []string{bundle.StagingDir(stuck), bundle.StagingDir(fetching), stuck} {
		must(t, os.MkdirAll(d, 0o755))
	}
	a.removeStaging([]*machine.Record{{ID: "a", Phase: machine.PhaseDetected, Dir: stuck}, {ID: "b", Phase: machine.PhaseFetching, Dir: fetching}})
	if _, err := os.Stat(bundle.StagingDir(stuck)); !os.IsNotExist(err) {
		t.Error("staging dir kept")
	}
	if _, err := os.Stat(bundle.StagingDir(fetching)); err != nil {
		t.Errorf("the fetch's own staging dir removed: %v", err)
	}
	if _, err := os.Stat(stuck); err != nil {
		t.Errorf("a published dir removed here (the reducer's to remove): %v", err)
	}
}
