// Package packaging checks what ships: the systemd unit, the RPM, the
// CoreOS layering and MachineConfig examples, the shell completions and the
// docs, against the code they describe.
package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// root is the repository root.
var root = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}()

// repoFile reads a file of the repository.
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// needTool returns the path of a tool the test needs. Missing, the test
// fails under CI=true (test/setup/install-deps.sh installs it) and skips
// elsewhere.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := name + " not found: apt-get install " + pkg + " (test/setup/install-deps.sh)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// run runs a command and returns its stdout; stderr goes in the failure.
func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// runErr runs a command and returns its stdout and stderr together.
func runErr(t *testing.T, dir string, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

var (
	buildOnce sync.Once
	buildDir  string
	buildPath string
	buildErr  error
	buildOut  string
)

// ferryBinary builds cmd/ferry once per test run, with the version set the
// way the RPM and the Makefile set it.
func ferryBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "ferry-packaging-test-")
		if buildErr != nil {
			return
		}
		buildPath = filepath.Join(buildDir, "ferry")
		cmd := exec.Command("go", "build", "-ldflags", "-X main.version=test-version", "-o", buildPath, "./cmd/ferry")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		buildErr, buildOut = err, string(out)
	})
	if buildErr != nil {
		t.Fatalf("go build ./cmd/ferry: %v\n%s", buildErr, buildOut)
	}
	return buildPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}
