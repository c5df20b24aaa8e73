package clusterbench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ferry-edge/ferry/test/crioenv"
)

// Every node's connections must come from its own address, as on a real
// cluster: a peer server counts a client's connections by its address
// (16 at most), and on one host the kernel gives every connection to a
// 127.0.x.y address the source 127.0.0.1, so past nine nodes the peers
// would refuse each other. Each agent runs in a cgroup (v2, the host's
// unified hierarchy) of its own, and one iptables rule per node rewrites
// the source of what that cgroup sends to its node's address. Only the
// benchmark's cgroups match; the rules and cgroups go when it ends.

const unified = "/sys/fs/cgroup/unified"

// sourcePrefix puts node's agent (and the ferry commands run against it)
// in a cgroup whose connections leave from ip; it returns the argv prefix
// that starts a command there (ferryenv.StartIn).
func sourcePrefix(b testing.TB, node, ip string) []string {
	b.Helper()
	_, err := exec.LookPath("iptables")
	crioenv.Need(b, err == nil, "no iptables: apt-get install iptables (each node's connections leave from its own address)")
	_, err = os.Stat(filepath.Join(unified, "cgroup.procs"))
	crioenv.Need(b, err == nil, "no cgroup v2 hierarchy at %s (each node's connections leave from its own address)", unified)
	rel := fmt.Sprintf("ferry-bench-%d/%s", os.Getpid(), node)
	dir := filepath.Join(unified, rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	rule := []string{"POSTROUTING", "-m", "cgroup", "--path", rel, "-j", "SNAT", "--to-source", ip}
	iptables := func(op string) error {
		args := append([]string{"-w", "-t", "nat", op}, rule...)
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %v: %v: %s", args, err, out)
		}
		return nil
	}
	if err := iptables("-A"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := iptables("-D"); err != nil {
			b.Error(err)
		}
		os.Remove(dir)
		os.Remove(filepath.Dir(dir)) // the last node's removal empties it
	})
	return []string{"sh", "-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(dir, "cgroup.procs")}
}
