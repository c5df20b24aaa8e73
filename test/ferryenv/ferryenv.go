// Package ferryenv builds the ferry binary once per test binary and runs
// real `ferry agent` processes with scratch configs.
package ferryenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/localapi"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary returns the path of a ferry binary built from this checkout.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		dir, err := os.MkdirTemp("", "ferry-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "ferry")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/ferry")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// Config is a scratch config under root: every path inside it, loading
// off (no CRI-O socket), no peer server, loop devices read as sticks,
// approval off (a test of the approval default sets Approval = "required"),
// pacing off (a test of pacing sets Pacing.Enabled).
func Config(root string) agent.Config {
	c := agent.DefaultConfig()
	c.NodeName = "test-node"
	c.Approval = "off"
	c.Paths = agent.Paths{
		StateDir:          filepath.Join(root, "state"),
		ExtractDir:        filepath.Join(root, "upgrade"),
		MountDir:          filepath.Join(root, "media"),
		Socket:            filepath.Join(root, "ferry.sock"),
		CRIOConfDir:       filepath.Join(root, "etc/crio/crio.conf.d"),
		RegistriesConfDir: filepath.Join(root, "etc/containers/registries.conf.d"),
		CertsDir:          filepath.Join(root, "etc/containers/certs.d"),
		// None there: every image is admitted, as on a node without one.
		SignaturePolicy: filepath.Join(root, "etc/containers/policy.json"),
		RegistriesD:     filepath.Join(root, "etc/containers/registries.d"),
	}
	// Tests plug loop devices, which ferry does not take for sticks
	// unless told (VM tests plug USB sticks, read by default).
	c.Media.AllowDevices = []string{"loop"}
	// Their sticks are ext4 images (mkfs.ext4 -d), which a node reads only
	// when told.
	c.Media.ExtraFilesystems = []string{"ext4"}
	c.Pull.PullSecret = "" // not the host's
	// Pacing reads the whole machine's pressure: on a machine running
	// other tests (or a busy CI runner) it would hold this agent's load
	// back for its neighbours' work, and the test would time out.
	// Pacing's own tests are internal/pacing's and test/release's.
	c.Pacing.Enabled = false
	c.CRIO.Socket = ""
	c.CRIO.Reload = "none"
	c.Peer.Listen = ""
	return c
}

// Agent is a running `ferry agent` process.
type Agent struct {
	t       testing.TB
	Cfg     agent.Config
	CfgPath string
	Cmd     *exec.Cmd
	Log     *bytes.Buffer
	Env     []string
	Prefix  []string // e.g. ip netns exec NAME
	mu      sync.Mutex
	exited  chan struct{}
}

// Start writes cfg next to its state dir and starts the agent.
func Start(t testing.TB, cfg agent.Config, env ...string) *Agent {
	t.Helper()
	return StartIn(t, nil, cfg, env...)
}

// StartIn is Start with every command (the agent and the ferry commands
// run against it) prefixed by prefix, e.g. ip netns exec NAME.
func StartIn(t testing.TB, prefix []string, cfg agent.Config, env ...string) *Agent {
	t.Helper()
	a := &Agent{t: t, Cfg: cfg, Env: env, Prefix: prefix}
	a.CfgPath = filepath.Join(filepath.Dir(cfg.Paths.StateDir), "config.toml")
	var b bytes.Buffer
	if err := agent.WriteConfig(&b, cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(a.CfgPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(a.CfgPath, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	a.Restart()
	t.Cleanup(a.Stop)
	return a
}

// Restart starts the process again (after Kill or Stop).
func (a *Agent) Restart() {
	a.t.Helper()
	args := append(append([]string{}, a.Prefix...), Binary(a.t), "agent", "--config", a.CfgPath)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), a.Env...)
	a.Log = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = &lockedWriter{w: a.Log, mu: &a.mu}, &lockedWriter{w: a.Log, mu: &a.mu}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	a.Cmd, a.exited = cmd, make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); close(done) }(cmd, a.exited)
}

// Logs returns what the agent printed so far.
func (a *Agent) Logs() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.Log.String()
}

// Kill sends SIGKILL and waits for the process to die.
func (a *Agent) Kill() {
	if a.Cmd == nil || a.Cmd.Process == nil {
		return
	}
	a.Cmd.Process.Kill()
	<-a.exited
}

// Stop sends SIGTERM, then SIGKILL after 10 s.
func (a *Agent) Stop() {
	if a.Cmd == nil || a.Cmd.Process == nil {
		return
	}
	select {
	case <-a.exited:
		return
	default:
	}
	a.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
	case <-time.After(10 * time.Second):
		a.Kill()
	}
}

// Exited is closed when the process ends.
func (a *Agent) Exited() <-chan struct{} { return a.exited }

// Status asks the agent over its socket, as `ferry status` does, from
// the test's own process: polling every node several times a second by
// starting `ip netns exec … ferry status` took a fifth of the CPU of a
// two-core bench, which the nodes it measures were short of.
func (a *Agent) Status(ctx context.Context) (agent.Status, error) {
	return localapi.NewClient(a.Cfg.Paths.Socket).Status(ctx)
}

// StatusCommand asks the agent through `ferry status -o json`, the
// technician's command. The error is the command's when it fails.
func (a *Agent) StatusCommand(ctx context.Context) (agent.Status, error) {
	var s agent.Status
	args := append(append([]string{}, a.Prefix...), Binary(a.t), "status", "-o", "json", "--config", a.CfgPath)
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).Output()
	if len(out) > 0 {
		if jerr := json.Unmarshal(out, &s); jerr != nil {
			return s, fmt.Errorf("status output %q: %v", out, jerr)
		}
		return s, nil
	}
	return s, err
}

// Wait polls status until cond holds, failing after timeout.
func (a *Agent) Wait(timeout time.Duration, what string, cond func(agent.Status) bool) agent.Status {
	a.t.Helper()
	deadline := time.Now().Add(timeout)
	var last agent.Status
	for time.Now().Before(deadline) {
		select {
		case <-a.exited:
			a.t.Fatalf("agent exited while waiting for %s; log:\n%s", what, a.Logs())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := a.Status(ctx)
		cancel()
		if err == nil {
			last = s
			if cond(s) {
				return s
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.t.Fatalf("timed out after %s waiting for %s; last status %+v; log:\n%s", timeout, what, last, a.Logs())
	return last
}

// WaitPhase waits for the active bundle's phase.
func (a *Agent) WaitPhase(timeout time.Duration, p agent.Phase) agent.Status {
	a.t.Helper()
	return a.Wait(timeout, "phase "+string(p), func(s agent.Status) bool { return s.Phase == string(p) })
}

// Ferry runs a ferry subcommand against this agent's config.
func (a *Agent) Ferry(args ...string) (string, error) {
	full := append(append([]string{}, a.Prefix...), Binary(a.t))
	full = append(full, args...)
	full = append(full, "--config", a.CfgPath)
	out, err := exec.Command(full[0], full[1:]...).CombinedOutput()
	return string(out), err
}

// TurnsRefused has the agent's loop turn n times on a request it refuses
// (args: a ferry command, e.g. "proceed" when nothing is cluster-ready),
// failing unless each is refused with exit 1. A turn publishes the status
// and hands it to every follower (the Node's annotations, the
// UpgradeBundle), as any event does, and the command returns only after
// its turn: a test that shows nothing happens waits on these turns, not
// on time.
func (a *Agent) TurnsRefused(n int, args ...string) {
	a.t.Helper()
	for range n {
		out, err := a.Ferry(args...)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			a.t.Fatalf("ferry %s, to be refused: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
