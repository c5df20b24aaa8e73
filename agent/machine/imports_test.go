package machine

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The state machine is a room of its own (docs/design.md, "The rooms"):
// it links the standard library's smallest packages and ferry's leaves of
// them, no network client, no I/O, no fmt. These bound what it links, and
// what the agent around it links.
const (
	maxMachineDeps = 59  // go list -deps, itself and the standard library counted
	maxAgentDeps   = 299 // the same for package agent
)

// forbidden are the packages (and those below them) the machine must not
// link: a network or a TLS client, crypto, I/O, JSON, fmt and slog (the
// agent formats and writes), reflect, go-digest (fmt, regexp, crypto).
var forbidden = []string{"net", "crypto", "os", "encoding/json", "fmt", "log", "reflect", "regexp",
	"google.golang.org/grpc", "github.com/opencontainers/go-digest", "golang.org/x/sys"}

func TestImports_MachineIsARoomOfItsOwn(t *testing.T) {
	deps, imports := goListDeps(t, ".")
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("agent/machine links %s (%s is forbidden here): %s", d, f, strings.Join(importChain(imports, deps[len(deps)-1], d), " → "))
			}
		}
	}
	if len(deps) > maxMachineDeps {
		t.Errorf("agent/machine links %d packages, at most %d allowed; they are:\n%s", len(deps), maxMachineDeps, strings.Join(deps, "\n"))
	}
	if agent, _ := goListDeps(t, ".."); len(agent) > maxAgentDeps {
		t.Errorf("agent links %d packages, at most %d allowed", len(agent), maxAgentDeps)
	}
}

// goListDeps is go list -deps of the package in dir, the package itself
// last, and each package's imports.
func goListDeps(t *testing.T, dir string) (deps []string, imports map[string][]string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, ".")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps in %s: %v (go must be on PATH)", dir, err)
	}
	imports = map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		deps = append(deps, f[0])
		imports[f[0]] = f[1:]
	}
	return deps, imports
}

// importChain is the shortest chain of imports from one package to another.
func importChain(imports map[string][]string, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var chain []string
			for ; p != ""; p = prev[p] {
				chain = append(chain, p)
			}
			slices.Reverse(chain)
			return chain
		}
		for _, q := range imports[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return []string{from, "…", to}
}
