//go:build faults

package faults

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/udevenv"
)

// Every agent of the campaign watches the host's block devices, so the
// campaign holds udevenv's device lock (and a running udevd) throughout.
func TestMain(m *testing.M) { os.Exit(udevenv.Main(m)) }

// bound is how long one step may take before the trial fails instead of
// hanging; not a speed requirement.
const bound = 3 * time.Minute

// errNotExercised marks a trial whose fault could not be injected (the
// work finished first): it counts neither as a pass nor as a failure.
var errNotExercised = errors.New("fault not exercised")

// campaign counts the trials of one case and prints "<name>: p/n passed".
type campaign struct {
	t              *testing.T
	name           string
	trials, passed int
	skipped        int
}

func newCampaign(t *testing.T, name string) *campaign {
	c := &campaign{t: t, name: name}
	t.Cleanup(c.report)
	return c
}

// trial runs one trial; an error fails it (and the test) without stopping
// the campaign.
func (c *campaign) trial(i int, f func() error) {
	c.t.Helper()
	start := time.Now()
	err := f()
	switch {
	case errors.Is(err, errNotExercised):
		c.skipped++
		c.t.Logf("%s trial %d: %v", c.name, i, err)
	case err != nil:
		c.trials++
		c.t.Errorf("%s trial %d FAILED after %s: %v", c.name, i, time.Since(start).Round(time.Millisecond), err)
	default:
		c.trials++
		c.passed++
		c.t.Logf("%s trial %d passed in %s", c.name, i, time.Since(start).Round(time.Millisecond))
	}
}

func (c *campaign) report() {
	line := fmt.Sprintf("%s: %d/%d passed", c.name, c.passed, c.trials)
	if c.skipped > 0 {
		line += fmt.Sprintf(" (%d more not exercised: the work finished before the fault)", c.skipped)
	}
	fmt.Println(line)
	if c.trials == 0 {
		c.t.Errorf("%s: no trial exercised the fault", c.name)
	}
}

// trials reads FAULTS_<NAME>_TRIALS (e.g. FAULTS_KILL_EXTRACT_TRIALS), or def.
func trials(name string, def int) int {
	env := "FAULTS_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_TRIALS"
	if n, err := strconv.Atoi(os.Getenv(env)); err == nil && n >= 0 {
		return n
	}
	return def
}

// rng draws the kill points; the seed is logged so that a failing run can
// be replayed with FAULTS_SEED.
func rng(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("FAULTS_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("FAULTS_SEED=%d", seed)
	return rand.New(rand.NewPCG(seed, 8))
}

// workDir is where big bundles are kept between runs (FAULTS_DIR).
func workDir(t *testing.T) string {
	d := os.Getenv("FAULTS_DIR")
	if d == "" {
		d = "/var/tmp/ferry-faults"
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func needRoot(t *testing.T) {
	t.Helper()
	crioenv.Need(t, os.Geteuid() == 0, "the fault campaign needs root")
}

// waitFor polls `ferry status -o json` until cond holds. It fails when the
// agent exits or after timeout, with the last status and the log's tail.
func waitFor(a *ferryenv.Agent, timeout time.Duration, what string, cond func(agent.Status) bool) (agent.Status, error) {
	deadline := time.Now().Add(timeout)
	var last agent.Status
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-a.Exited():
			return last, fmt.Errorf("the agent exited while waiting for %s; log:\n%s", what, tail(a.Logs(), 30))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := a.Status(ctx)
		cancel()
		if err == nil {
			last = s
			if cond(s) {
				return s, nil
			}
		} else {
			lastErr = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return last, fmt.Errorf("timed out after %s waiting for %s; last status: phase %q reason %q line %q (status error: %v); log:\n%s",
		timeout, what, last.Phase, last.Reason, last.Line, lastErr, tail(a.Logs(), 30))
}

func phaseIs(p agent.Phase) func(agent.Status) bool {
	return func(s agent.Status) bool { return s.Phase == string(p) }
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// ensureRunning restarts the agent if it is not running (a trial that
// failed may have left it dead).
func ensureRunning(a *ferryenv.Agent) {
	select {
	case <-a.Exited():
		a.Restart()
	default:
	}
}

// ferry runs a ferry subcommand against a's config and fails with its
// output.
func ferry(a *ferryenv.Agent, args ...string) error {
	deadline := time.Now().Add(bound)
	for {
		out, err := a.Ferry(args...)
		switch {
		case err == nil:
			return nil
		// Busy with a job of its own (re-pinning after CRI-O came back):
		// a technician tries again when it is done, as the agent says.
		case strings.Contains(out, "try again when it is done") && time.Now().Before(deadline):
			time.Sleep(200 * time.Millisecond)
		default:
			return fmt.Errorf("ferry %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
}

// cleanupNode runs `ferry cleanup` unless the node holds nothing, and
// waits until nothing holds the node (idle, or upgraded for a loaded
// bundle: its pins stay until the next upgrade).
func cleanupNode(a *ferryenv.Agent) error {
	s, err := waitFor(a, bound, "the agent to answer", func(agent.Status) bool { return true })
	if err != nil {
		return err
	}
	if !agent.Phase(s.Phase).Active() {
		return nil // idle, or showing a refusal: nothing held
	}
	if err := ferry(a, "cleanup"); err != nil {
		return err
	}
	_, err = waitFor(a, bound, "idle after cleanup", func(s agent.Status) bool {
		return s.Phase == "idle" || s.Phase == string(agent.PhaseUpgraded)
	})
	return err
}

// activeRecord is the record the agent would resume from, read from its
// state dir (nil when none is active).
func activeRecord(stateDir string) (*agent.Record, error) {
	return findRecord(stateDir, func(r *agent.Record) bool { return r.Phase.Active() })
}

// upgradedRecord reports whether the state dir holds an upgraded
// record of bundle d: one whose images stay pinned.
func upgradedRecord(stateDir string, d digest.Digest) (bool, error) {
	r, err := findRecord(stateDir, func(r *agent.Record) bool { return r.Digest == d && r.Phase == agent.PhaseUpgraded })
	return r != nil, err
}

// findRecord is the first record of the state dir that match takes, or nil.
func findRecord(stateDir string, match func(*agent.Record) bool) (*agent.Record, error) {
	store, err := agent.OpenStore(stateDir)
	if err != nil {
		return nil, err
	}
	recs, err := store.Load()
	if err != nil {
		return nil, fmt.Errorf("state dir %s: %w", stateDir, err)
	}
	for _, r := range recs {
		if match(r) {
			return r, nil
		}
	}
	return nil, nil
}

// verifiedPhase: the record's bundle was verified (its digest matched).
func verifiedPhase(p agent.Phase) bool {
	switch p {
	case agent.PhaseExtracted, agent.PhaseLoading, agent.PhaseLoaded, agent.PhaseClusterReady:
		return true
	}
	return false
}

// checkTree is the test's own check of an extracted bundle: metadata.json
// parses, every blob hashes to the digest it is stored under, every image
// of the metadata has its manifest blob, and (for test/bigbundle bundles)
// the blob count is right.
func checkTree(dir string, wantBlobs int) error {
	b, err := os.ReadFile(filepath.Join(dir, bundle.MetadataName))
	if err != nil {
		return err
	}
	meta, err := bundle.ParseMetadata(b)
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	blobs := filepath.Join(dir, "docker/registry/v2/blobs/sha256")
	n := 0
	err = filepath.WalkDir(blobs, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		if hex.EncodeToString(h.Sum(nil)) != filepath.Base(filepath.Dir(p)) {
			return fmt.Errorf("%s: content does not match its digest", p)
		}
		n++
		return nil
	})
	if err != nil {
		return err
	}
	for _, img := range meta.AllImages() {
		_, d, ok := strings.Cut(img, "@sha256:")
		if !ok || len(d) != 64 {
			continue
		}
		if _, err := os.Stat(filepath.Join(blobs, d[:2], d, "data")); err != nil {
			return fmt.Errorf("%s: manifest of %s missing: %w", dir, img, err)
		}
	}
	if wantBlobs > 0 && n != wantBlobs {
		return fmt.Errorf("%s: %d blobs, want %d", dir, n, wantBlobs)
	}
	return nil
}

// node is one agent under test and what is true of its bundle.
type node struct {
	a         *ferryenv.Agent
	cfg       agent.Config
	digest    digest.Digest // the bundle's right digest
	wantBlobs int           // blob count of a complete tree (0: unknown)
	crio      *crioenv.CRIO
	cl        *crio.Client
	allowed   map[string]bool // pins allowed in CRI-O: other drop-ins' and the bundle's
	bundleRef map[string]bool // the bundle's own references
}

// invariants checks what must hold at any instant, agent alive or killed:
//   - every dir published in the extract dir is a complete, verified tree;
//     a record that says extracted (or later) has the right digest and its
//     dir is complete;
//   - with CRI-O: every file in crio.conf.d and registries.conf.d decodes
//     as TOML; CRI-O answers over CRI; its live config (GET /config on its
//     socket, as curl does) decodes; its log never says it could not
//     reload; every live pin is another drop-in's or the bundle's, and the
//     bundle's are pinned only once the record says it was verified.
func (n *node) invariants(ctx context.Context) error {
	var errs []error
	rec, err := activeRecord(n.cfg.Paths.StateDir)
	if err != nil {
		errs = append(errs, err)
	}
	ents, err := os.ReadDir(n.cfg.Paths.ExtractDir)
	if err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".staging-") || !e.IsDir() {
			continue
		}
		if err := checkTree(filepath.Join(n.cfg.Paths.ExtractDir, e.Name()), n.wantBlobs); err != nil {
			errs = append(errs, fmt.Errorf("a published dir is not a complete bundle: %w", err))
		}
	}
	verified := rec != nil && verifiedPhase(rec.Phase)
	if verified {
		if rec.Digest != n.digest {
			errs = append(errs, fmt.Errorf("the record says %s of digest %s, want %s", rec.Phase, rec.Digest, n.digest))
		}
		if err := checkTree(rec.Dir, n.wantBlobs); err != nil {
			errs = append(errs, fmt.Errorf("the record says %s but: %w", rec.Phase, err))
		}
	}
	if n.crio != nil {
		for _, d := range []string{n.cfg.Paths.CRIOConfDir, n.cfg.Paths.RegistriesConfDir} {
			files, _ := os.ReadDir(d)
			for _, f := range files {
				var v map[string]any
				if _, err := toml.DecodeFile(filepath.Join(d, f.Name()), &v); err != nil {
					errs = append(errs, fmt.Errorf("broken drop-in %s: %w", filepath.Join(d, f.Name()), err))
				}
			}
		}
		vctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := n.cl.Version(vctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("CRI-O does not answer: %w", err))
		}
		pins, err := livePins(ctx, n.crio.Socket)
		if err != nil {
			errs = append(errs, err)
		}
		// An upgraded bundle's pins stay until the next upgrade (ferry
		// cleanup of a loaded bundle is the upgrade done).
		kept, err := upgradedRecord(n.cfg.Paths.StateDir, n.digest)
		if err != nil {
			errs = append(errs, err)
		}
		for _, p := range pins {
			switch {
			case !n.allowed[p]:
				errs = append(errs, fmt.Errorf("CRI-O pins %s, which no drop-in nor the bundle names", p))
			case n.bundleRef[p] && !(verified && rec.Digest == n.digest) && !kept:
				errs = append(errs, fmt.Errorf("CRI-O pins the bundle's %s but the record does not say it was verified (%v)", p, rec))
			}
		}
		if log, _ := os.ReadFile(n.crio.LogFile); len(log) > 0 {
			if err := reloadsFailed(string(log)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// livePins asks CRI-O for its live configuration the way curl does
// (`curl --unix-socket SOCK http://localhost/config`) and returns its
// pinned_images; the answer must be valid TOML.
func livePins(ctx context.Context, socket string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "curl", "-sS", "--fail", "--unix-socket", socket, "http://localhost/config").Output()
	if err != nil {
		return nil, fmt.Errorf("curl --unix-socket %s http://localhost/config: %w", socket, err)
	}
	var conf struct {
		Crio struct {
			Image struct {
				PinnedImages []string `toml:"pinned_images"`
			} `toml:"image"`
		} `toml:"crio"`
	}
	if _, err := toml.Decode(string(out), &conf); err != nil {
		return nil, fmt.Errorf("CRI-O's live config is not valid TOML: %w", err)
	}
	return conf.Crio.Image.PinnedImages, nil
}

// converged checks the node ended where it should: the wanted phase with
// the right digest, the tree complete, and with CRI-O every reference of
// the bundle present and pinned.
func (n *node) converged(ctx context.Context, want agent.Phase) error {
	s, err := waitFor(n.a, bound, "phase "+string(want), func(s agent.Status) bool {
		return s.Phase == string(want) || s.Phase == string(agent.PhaseRejected) || s.Phase == string(agent.PhaseFailed)
	})
	if err != nil {
		return err
	}
	if s.Phase != string(want) {
		return fmt.Errorf("ended %s (%s), want %s", s.Phase, s.Reason, want)
	}
	if s.Digest != n.digest {
		return fmt.Errorf("%s with digest %s, want %s", want, s.Digest, n.digest)
	}
	if n.crio != nil {
		for ref := range n.bundleRef {
			present, pinned, err := n.cl.Status(ctx, ref)
			if err != nil {
				return err
			}
			if !present || !pinned {
				return fmt.Errorf("%s: present=%v pinned=%v", ref, present, pinned)
			}
		}
	}
	return n.invariants(ctx)
}

// randomPoint is a random instant in [0, span).
func randomPoint(r *rand.Rand, span time.Duration) time.Duration {
	return time.Duration(r.Int64N(int64(span)))
}

// reloadsFailed says whether CRI-O's log shows a drop-in it could not
// read. A reload that found a drop-in gone between listing its directory
// and reading it ("walk path: lstat …: no such file or directory") raced
// a write of the next configuration (an agent killed after asking for a
// reload, its restart writing again): that counts only when no reload
// completed after it.
func reloadsFailed(log string) error {
	var vanished string
	for _, l := range strings.Split(log, "\n") {
		switch {
		case strings.Contains(l, "Unable to reload configuration") && strings.Contains(l, "no such file or directory"):
			vanished = l
		case strings.Contains(l, "Unable to reload configuration"):
			return fmt.Errorf("CRI-O could not reload its configuration: a drop-in was broken: %s", l)
		case strings.Contains(l, "Configuration reload completed"):
			vanished = ""
		}
	}
	if vanished != "" {
		return fmt.Errorf("CRI-O's last reload failed and none completed after it: %s", vanished)
	}
	return nil
}
