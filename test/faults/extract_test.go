//go:build faults

package faults

import (
	"context"
	"errors"
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
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/test/bigbundle"
	"github.com/ferry-edge/ferry/test/ferryenv"
)

// bigBundle makes (or reuses) a test/bigbundle bundle of sizeMiB MiB in
// blobMiB MiB blobs and returns its path, digest and blob count.
func bigBundle(t *testing.T, sizeMiB, blobMiB int64) (string, digest.Digest, int) {
	t.Helper()
	p, err := bigbundle.Make(sizeMiB<<20, blobMiB<<20, workDir(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(strings.TrimSuffix(p, ".tar") + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	return p, digest.Digest("sha256:" + string(b[:64])), bigbundle.Blobs(sizeMiB, blobMiB)
}

// TestFaults_KillDuringExtract: kill -9 of the agent at a random point of
// the verification and extraction of a bundle given with `ferry load`; on
// restart the agent has the bundle extracted, or has rolled the copy back
// and asks for ferry load again (which completes it); the bundle ends
// extracted, complete, with the right digest, and at no instant was a
// partial tree published.
func TestFaults_KillDuringExtract(t *testing.T) {
	needRoot(t)
	c := newCampaign(t, "kill-extract")
	tarPath, digest, blobs := bigBundle(t, 512, 8)
	cfg := ferryenv.Config(t.TempDir())
	a := ferryenv.Start(t, cfg)
	n := &node{a: a, cfg: cfg, digest: digest, wantBlobs: blobs}
	if _, err := waitFor(a, bound, "idle", phaseIs("idle")); err != nil {
		t.Fatal(err)
	}

	// One clean run gives the span to draw kill points from.
	start := time.Now()
	if err := ferry(a, "load", tarPath); err != nil {
		t.Fatal(err)
	}
	if err := n.converged(t.Context(), agent.PhaseExtracted); err != nil {
		t.Fatal(err)
	}
	span := time.Since(start)
	t.Logf("a whole extraction of 512 MiB took %s", span)

	r := rng(t)
	for i := range trials("kill-extract", 20) {
		c.trial(i, func() error {
			ensureRunning(a)
			if err := cleanupNode(a); err != nil {
				return err
			}
			if err := ferry(a, "load", tarPath); err != nil {
				return err
			}
			at := randomPoint(r, span)
			time.Sleep(at)
			a.Kill()
			if err := n.invariants(t.Context()); err != nil {
				return fmt.Errorf("killed %s in: %w", at, err)
			}
			a.Restart()
			// The file came as a descriptor, gone with the agent: an
			// unfinished copy is rolled back and ferry load asked again.
			s, err := waitFor(a, bound, "extracted, or asking for ferry load again", func(s agent.Status) bool {
				return s.Phase == string(agent.PhaseExtracted) || s.Reason == agent.ReasonCopyInterrupted
			})
			if err != nil {
				return fmt.Errorf("killed %s in, after restart: %w", at, err)
			}
			if s.Phase != string(agent.PhaseExtracted) {
				if err := ferry(a, "load", tarPath); err != nil {
					return err
				}
			}
			if err := n.converged(t.Context(), agent.PhaseExtracted); err != nil {
				return fmt.Errorf("killed %s in, after restart: %w", at, err)
			}
			if m, _ := filepath.Glob(filepath.Join(cfg.Paths.ExtractDir, ".staging-*")); len(m) != 0 {
				return fmt.Errorf("staging left: %v", m)
			}
			return nil
		})
	}
}

// TestFaults_DiskFull: the extract dir is a small filesystem (a tmpfs with
// size=). Too small for the bundle: refused before a byte is written. Big
// enough at the check but filled up by something else during extraction:
// refused with a clear reason, nothing published, no staging left; once
// the space is freed, loading again completes.
func TestFaults_DiskFull(t *testing.T) {
	needRoot(t)
	c := newCampaign(t, "disk-full")
	tarPath, digest, blobs := bigBundle(t, 256, 8)
	root := t.TempDir()
	cfg := ferryenv.Config(root)
	small := cfg.Paths.ExtractDir
	mountTmpfs(t, small, 400<<20) // < 2 × 256 MiB: refused by the space check
	a := ferryenv.Start(t, cfg)
	n := &node{a: a, cfg: cfg, digest: digest, wantBlobs: blobs}
	if _, err := waitFor(a, bound, "idle", phaseIs("idle")); err != nil {
		t.Fatal(err)
	}

	c.trial(0, func() error {
		if err := ferry(a, "load", tarPath); err != nil {
			return err
		}
		s, err := waitFor(a, bound, "refusal", func(s agent.Status) bool { return s.Error != "" || s.Phase == string(agent.PhaseExtracted) })
		if err != nil {
			return err
		}
		if s.Phase == string(agent.PhaseExtracted) || s.Reason != agent.ReasonNotEnoughSpace {
			return fmt.Errorf("a bundle too big for the disk ended %s, %s: %q", s.Phase, s.Reason, s.Error)
		}
		t.Logf("too small: %s", s.Error)
		return emptyExtractDir(n)
	})

	remountTmpfs(t, small, 700<<20) // > 2 × 256 MiB: passes the check
	for i := 1; i <= trials("disk-full", 3); i++ {
		c.trial(i, func() error {
			ensureRunning(a)
			if err := cleanupNode(a); err != nil {
				return err
			}
			filler := filepath.Join(small, "filler")
			defer os.Remove(filler)
			if err := ferry(a, "load", tarPath); err != nil {
				return err
			}
			// Fill the disk as soon as the extraction writes.
			deadline := time.Now().Add(bound)
			for {
				if m, _ := filepath.Glob(filepath.Join(small, ".staging-*")); len(m) > 0 {
					break
				}
				if time.Now().After(deadline) {
					return errors.New("no staging dir appeared")
				}
				time.Sleep(time.Millisecond)
			}
			if err := fill(filler); err != nil {
				return err
			}
			s, err := waitFor(a, bound, "the extraction to end", func(s agent.Status) bool {
				return s.Phase == string(agent.PhaseExtracted) || s.Error != "" && s.Phase != string(agent.PhaseDetected)
			})
			if err != nil {
				return err
			}
			if s.Phase == string(agent.PhaseExtracted) {
				return fmt.Errorf("%w: extracted before the disk filled", errNotExercised)
			}
			if s.Reason != agent.ReasonNotEnoughSpace {
				return fmt.Errorf("refused for %s (%q), want %s", s.Reason, s.Error, agent.ReasonNotEnoughSpace)
			}
			t.Logf("disk filled: %s", s.Error)
			if err := emptyExtractDir(n); err != nil {
				return err
			}
			os.Remove(filler)
			if err := ferry(a, "load", tarPath); err != nil {
				return err
			}
			return n.converged(t.Context(), agent.PhaseExtracted)
		})
	}
}

// emptyExtractDir: nothing but the filler in the extract dir, no record
// that says extracted.
func emptyExtractDir(n *node) error {
	ents, _ := os.ReadDir(n.cfg.Paths.ExtractDir)
	for _, e := range ents {
		if e.Name() != "filler" && e.Name() != "lost+found" {
			return fmt.Errorf("the refused bundle left %s in the extract dir", e.Name())
		}
	}
	return n.invariants(context.Background())
}

func mountTmpfs(t *testing.T, dir string, size int64) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.FormatInt(size, 10), "ferry-faults", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
}

func remountTmpfs(t *testing.T, dir string, size int64) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,size="+strconv.FormatInt(size, 10), dir).CombinedOutput(); err != nil {
		t.Fatalf("remount tmpfs: %v: %s", err, out)
	}
}

// fill allocates every free byte of the filesystem holding path.
func fill(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var off int64
	for chunk := int64(64 << 20); chunk >= 4096; {
		err := syscall.Fallocate(int(f.Fd()), 0, off, chunk)
		if err == nil {
			off += chunk
			continue
		}
		if !errors.Is(err, syscall.ENOSPC) {
			return fmt.Errorf("filling the disk: %w", err)
		}
		chunk /= 2
	}
	return nil
}
