package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Binaries are the per-run programs a node gets in its layer.
type Binaries struct {
	Ferry string // ./cmd/ferry
	Agent string // ./test/vm/guestagent (the control channel's guest end)
	// FerryUnit is the unit ferry runs under: packaging/ferry.service when
	// the repository has one, else test/vm/guest/ferry.service.
	FerryUnit []byte
	UnitFrom  string
	// FerrySlice is packaging/ferry.slice, the slice the packaged unit
	// runs in; nil with the stand-in unit.
	FerrySlice []byte
}

// RepoRoot is the directory holding the module's go.mod, found from the
// working directory upwards.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			strings.HasPrefix(string(data), "module github.com/ferry-edge/ferry\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the ferry repository (no go.mod found)")
		}
		dir = parent
	}
}

// BuildBinaries builds ferry and the guest agent, statically, into dir.
// FERRY_VM_FERRY names a ferry binary to use instead of building one.
func BuildBinaries(ctx context.Context, dir string) (*Binaries, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	b := &Binaries{Ferry: filepath.Join(dir, "ferry"), Agent: filepath.Join(dir, "ferry-vm-agent")}
	builds := []struct{ out, pkg string }{{b.Ferry, "./cmd/ferry"}, {b.Agent, "./test/vm/guestagent"}}
	if p := os.Getenv("FERRY_VM_FERRY"); p != "" {
		// a ferry built elsewhere (e.g. from a commit while the tree is mid-edit)
		b.Ferry, builds = p, builds[1:]
	}
	for _, x := range builds {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", x.out, x.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %w\n%s", x.pkg, err, out)
		}
	}
	b.UnitFrom = filepath.Join(root, "packaging/ferry.service")
	if u := os.Getenv("FERRY_VM_UNIT"); u != "" {
		b.UnitFrom = u // e.g. test/vm/guest/ferry.service, to tell the unit's sandbox from ferry
	}
	b.FerryUnit, err = os.ReadFile(b.UnitFrom)
	if errors.Is(err, os.ErrNotExist) && os.Getenv("FERRY_VM_UNIT") == "" {
		b.UnitFrom = "test/vm/guest/ferry.service"
		b.FerryUnit, err = guestFiles.ReadFile("guest/ferry.service")
	}
	if err != nil {
		return nil, err
	}
	if b.UnitFrom == filepath.Join(root, "packaging/ferry.service") {
		if b.FerrySlice, err = os.ReadFile(filepath.Join(root, "packaging/ferry.slice")); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// Node is what makes one guest a ferry node.
type Node struct {
	Name string // hostname and node_name
	// Config is /etc/ferry/config.toml.
	Config string
	// Addr ("10.77.0.1/24") is set on eth0 when the guest has a network.
	Addr string
	// Extra files, e.g. test hooks.
	Extra Layer
	// NoFerry leaves out ferry, its unit, slice and config: the node gets
	// them later, as a MachineConfig and a stick deliver them.
	NoFerry bool
}

// Layer is the files that make a guest this node: ferry, its unit and
// config, the control channel's agent, the hostname.
func (n Node) Layer(b *Binaries) (Layer, error) {
	ferry, err := os.ReadFile(b.Ferry)
	if err != nil {
		return nil, err
	}
	agent, err := os.ReadFile(b.Agent)
	if err != nil {
		return nil, err
	}
	emb := func(name string) []byte {
		data, err := guestFiles.ReadFile("guest/" + name)
		if err != nil {
			panic(err) // embedded at build time
		}
		return data
	}
	wants := "/etc/systemd/system/multi-user.target.wants/"
	l := Layer{
		"/usr/bin/ferry":                             {Data: ferry, Mode: 0o755},
		"/usr/local/bin/ferry-vm-agent":              {Data: agent, Mode: 0o755},
		"/usr/local/bin/ferry-vm-on-ready":           {Data: emb("on-ready"), Mode: 0o755},
		"/etc/systemd/system/ferry.service":          {Data: b.FerryUnit},
		"/etc/systemd/system/ferry-vm-agent.service": {Data: emb("ferry-vm-agent.service")},
		"/etc/systemd/system/ferry-vm-net.service":   {Data: emb("ferry-vm-net.service")},
		wants + "ferry.service":                      {Link: "/etc/systemd/system/ferry.service"},
		wants + "ferry-vm-agent.service":             {Link: "/etc/systemd/system/ferry-vm-agent.service"},
		"/etc/ferry/config.toml":                     {Data: []byte(n.Config), Mode: 0o600},
		"/etc/hostname":                              {Data: []byte(n.Name + "\n")},
		"/etc/hosts":                                 {Data: []byte("127.0.0.1 localhost\n127.0.1.1 " + n.Name + "\n")},
		"/etc/machine-id":                            {Data: []byte(machineID(n.Name) + "\n"), Mode: 0o444},
	}
	if b.FerrySlice != nil {
		l["/etc/systemd/system/ferry.slice"] = File{Data: b.FerrySlice}
	}
	if n.NoFerry {
		for _, p := range []string{"/usr/bin/ferry", "/etc/systemd/system/ferry.service", "/etc/systemd/system/ferry.slice",
			wants + "ferry.service", "/etc/ferry/config.toml"} {
			delete(l, p)
		}
	}
	if n.Addr != "" {
		l["/etc/ferry-vm/net.env"] = File{Data: []byte("ADDR=" + n.Addr + "\n")}
		l[wants+"ferry-vm-net.service"] = File{Link: "/etc/systemd/system/ferry-vm-net.service"}
	}
	for p, f := range n.Extra {
		l[p] = f
	}
	return l, nil
}

// machineID is a stable 32-hex id per node name.
func machineID(name string) string {
	return hashStrings("machine-id", name) + hashStrings("machine-id-2", name)
}
