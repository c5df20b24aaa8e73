//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
)

// mcoPin is what MCO's 50-pinned-images drop-in pins: it must stay pinned.
var mcoPin = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + strings.Repeat("7", 64)

// crioNode is a real CRI-O (run by hand, reloaded by SIGHUP), a bundle of
// images images made by `ferry bundle create` from a TLS registry, and an
// agent loading into that CRI-O.
func crioNode(t *testing.T, images int, imageSize int64) (*node, string) {
	t.Helper()
	c := crioenv.Start(t)
	crioenv.Write(t, filepath.Join(c.Dropins.CRIOConfDir, "50-pinned-images"), "[crio.image]\npinned_images = [\""+mcoPin+"\"]\n")

	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: images, ImageSize: imageSize})
	reg.PushImage(t, "my-company/my-workload", "v1")
	out := t.TempDir()
	cmd := exec.Command(ferryenv.Binary(t), "bundle", "create", "--release", release,
		"--mirror", reg.Mirror(), "--cert-dir", reg.CertsDir,
		"--extra-image", "quay.io/my-company/my-workload:v1", "--output", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ferry bundle create: %v\n%s", err, b)
	}
	tarPath := filepath.Join(out, "upgrade-4.13.7-x86_64.tar")
	meta, err := bundle.InspectFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	sha, err := os.ReadFile(filepath.Join(out, "upgrade-4.13.7-x86_64.sha256"))
	if err != nil {
		t.Fatal(err)
	}

	cfg := ferryenv.Config(t.TempDir())
	c.Configure(&cfg)
	n := &node{
		a: ferryenv.Start(t, cfg), cfg: cfg, digest: digest.Digest("sha256:" + string(sha[:64])),
		crio: c, cl: c.Client(t),
		// CRI-O pins its pause image itself (crioenv's pause_image).
		allowed: map[string]bool{mcoPin: true, "quay.io/ferry-test/pause:none": true}, bundleRef: map[string]bool{},
	}
	for _, ref := range append(meta.AllImages(), bundle.PullRefs(meta.AllImages())...) {
		n.allowed[ref], n.bundleRef[ref] = true, true
	}
	if _, err := waitFor(n.a, bound, "idle", phaseIs("idle")); err != nil {
		t.Fatal(err)
	}
	return n, tarPath
}

// reset takes the node back to nothing: `ferry cleanup`, then every image
// of the bundle removed from CRI-O so that the next load pulls them all.
func (n *node) reset(ctx context.Context) error {
	ensureRunning(n.a)
	if err := cleanupNode(n.a); err != nil {
		return err
	}
	for ref := range n.bundleRef {
		if err := n.cl.Remove(ctx, ref); err != nil {
			return fmt.Errorf("removing %s: %w", ref, err)
		}
	}
	return n.invariants(ctx)
}

// TestFaults_CRIO runs the cases that need a real CRI-O, sharing one: kill
// -9 of the agent at random points of a load; CRI-O killed or stopped and
// restarted mid-load; the drop-in dirs unwritable (read-only bind mounts).
func TestFaults_CRIO(t *testing.T) {
	needRoot(t)
	n, tarPath := crioNode(t, 40, 256<<10)
	ctx := t.Context()
	r := rng(t)

	// One clean run gives the span to draw kill points from.
	start := time.Now()
	if err := ferry(n.a, "load", tarPath); err != nil {
		t.Fatal(err)
	}
	if err := n.converged(ctx, agent.PhaseClusterReady); err != nil {
		t.Fatal(err)
	}
	span := time.Since(start)
	t.Logf("a whole load of %d references took %s", len(n.bundleRef), span)

	t.Run("kill-load", func(t *testing.T) {
		c := newCampaign(t, "kill-load")
		for i := range trials("kill-load", 15) {
			c.trial(i, func() error {
				if err := n.reset(ctx); err != nil {
					return err
				}
				if err := ferry(n.a, "load", tarPath); err != nil {
					return err
				}
				at := randomPoint(r, span)
				time.Sleep(at)
				s, _ := n.a.Status(ctx)
				n.a.Kill()
				if err := n.invariants(ctx); err != nil {
					return fmt.Errorf("killed %s in (%s): %w", at, s.Line, err)
				}
				n.a.Restart()
				if err := loadAgainIfAsked(n, tarPath); err != nil {
					return fmt.Errorf("killed %s in (%s), after restart: %w", at, s.Line, err)
				}
				if err := n.converged(ctx, agent.PhaseClusterReady); err != nil {
					return fmt.Errorf("killed %s in (%s), after restart: %w", at, s.Line, err)
				}
				t.Logf("trial %d: killed %s in, at %q", i, at.Round(time.Millisecond), s.Line)
				return nil
			})
		}
	})

	t.Run("crio-restart", func(t *testing.T) {
		c := newCampaign(t, "crio-restart")
		for i := range trials("crio-restart", 4) {
			how := []string{"killed", "stopped"}[i%2]
			c.trial(i, func() error {
				if err := n.reset(ctx); err != nil {
					return err
				}
				if err := ferry(n.a, "load", tarPath); err != nil {
					return err
				}
				s, err := waitFor(n.a, bound, "pulls to start", func(s agent.Status) bool {
					return s.Phase == string(agent.PhaseLoading) && s.Progress != nil && s.Progress.Done > 0 ||
						s.Phase == string(agent.PhaseClusterReady)
				})
				if err != nil {
					return err
				}
				if how == "killed" {
					n.crio.Kill(t)
				} else if err := stopCRIO(n.crio); err != nil {
					return err
				}
				if s.Phase == string(agent.PhaseClusterReady) {
					n.crio.Start(t)
					return fmt.Errorf("%w: the load finished before CRI-O was %s", errNotExercised, how)
				}
				// The agent keeps running and says it waits.
				time.Sleep(2 * time.Second)
				st, err := n.a.Status(ctx)
				if err != nil {
					return fmt.Errorf("status while CRI-O is down: %w", err)
				}
				t.Logf("trial %d: CRI-O %s at %q; meanwhile: %q", i, how, s.Line, st.Line)
				n.crio.Start(t)
				return n.converged(ctx, agent.PhaseClusterReady)
			})
		}
	})

	t.Run("config-unwritable", func(t *testing.T) {
		c := newCampaign(t, "config-unwritable")
		dirs := []struct{ key, dir string }{
			{"crio_conf_dir", n.cfg.Paths.CRIOConfDir},
			{"registries_conf_dir", n.cfg.Paths.RegistriesConfDir},
			{"certs_dir", n.cfg.Paths.CertsDir},
		}
		for i := range trials("config-unwritable", 3) {
			d := dirs[i%len(dirs)]
			c.trial(i, func() error {
				if err := n.reset(ctx); err != nil {
					return err
				}
				undo, err := readOnly(d.dir)
				if err != nil {
					return err
				}
				defer undo()
				if err := ferry(n.a, "load", tarPath); err != nil {
					return err
				}
				s, err := waitFor(n.a, bound, "the load to fail", func(s agent.Status) bool {
					return s.Phase == string(agent.PhaseLoading) && s.Reason == agent.ReasonLoadFailed ||
						s.Phase == string(agent.PhaseClusterReady) || s.Phase == string(agent.PhaseFailed)
				})
				if err != nil {
					return err
				}
				if s.Phase != string(agent.PhaseLoading) {
					return fmt.Errorf("with %s read-only the load ended %s: %s", d.key, s.Phase, s.Line)
				}
				t.Logf("trial %d: %s read-only: %s", i, d.key, s.Reason)
				if err := n.invariants(ctx); err != nil {
					return err
				}
				if err := undo(); err != nil {
					return err
				}
				return n.converged(ctx, agent.PhaseClusterReady)
			})
		}
	})
}

// stopCRIO stops CRI-O with SIGTERM, as `systemctl stop crio` does, and
// waits for it to exit.
func stopCRIO(c *crioenv.CRIO) error {
	b, err := os.ReadFile(c.PidFile)
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
		if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); strings.Contains(string(st), ") Z ") {
			return nil // exited, not yet reaped
		}
	}
	return fmt.Errorf("CRI-O (pid %d) still running 30s after SIGTERM", pid)
}

// readOnly bind-mounts dir read-only over itself; undo (idempotent)
// unmounts it.
func readOnly(dir string) (func() error, error) {
	if out, err := exec.Command("mount", "--bind", dir, dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("bind mount %s: %v: %s", dir, err, out)
	}
	undo := func() error {
		if err := syscall.Unmount(dir, 0); err != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
		return nil
	}
	if out, err := exec.Command("mount", "-o", "remount,bind,ro", dir).CombinedOutput(); err != nil {
		undo()
		return nil, fmt.Errorf("remount %s read-only: %v: %s", dir, err, out)
	}
	done := false
	return func() error {
		if done {
			return nil
		}
		done = true
		return undo()
	}, nil
}

// loadAgainIfAsked runs `ferry load` again when the restarted agent asks
// for it: the agent never opens a caller's path (ferry load passes it the
// open file), so a file load killed before its copy was done waits for the
// technician, as its status says, rather than resuming alone.
func loadAgainIfAsked(n *node, tarPath string) error {
	s, err := waitFor(n.a, bound, "the load resumed or asked for again", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseClusterReady) || s.Reason == agent.ReasonCopyInterrupted
	})
	if err != nil || s.Phase == string(agent.PhaseClusterReady) {
		return err
	}
	return ferry(n.a, "load", tarPath)
}
