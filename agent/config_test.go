package agent

import (
	"bytes"
	"errors"
	"github.com/ferry-edge/ferry/agent/machine"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t testing.TB, body string) string {
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfig_ErrorsNameTheKey(t *testing.T) {
	for _, c := range []struct{ body, key string }{
		{"bogus = 1\n", "bogus"},
		{"[paths]\nstate = \"/x\"\n", "paths.state"},
		{"arch = \"mips\"\n", "arch"},
		{"approved_digests = [\"abc\"]\n", "approved_digests"},
		{"[crio]\nreload = \"maybe\"\n", "crio.reload"},
		{"[crio]\npull_workers = -1\n", "crio.pull_workers"},
		{"[paths]\nstate_dir = \"relative\"\n", "paths.state_dir"},
		{"[cluster]\nschedule = \"Soon\"\n", "cluster.schedule"},
		{"[registry]\nport = 70000\n", "registry.port"},
		{"node_name = 3\n", "node_name"},
		{"[media]\nallow_devices = [\"floppy\"]\n", "media.allow_devices"},
		{"[pacing]\nwatch = \"kubepods.slice\"\n", "pacing.watch"},
	} {
		_, err := LoadConfig(writeConfig(t, c.body), true)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%q: error %v does not name %s", c.body, err, c.key)
		}
	}
}

func TestLoadConfig_MediaAllowDevices(t *testing.T) {
	c, err := LoadConfig(writeConfig(t, "[media]\nallow_devices = [\"loop\", \"virtio\"]\n"), true)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Media.AllowDevices, ",") != "loop,virtio" {
		t.Fatalf("allow_devices = %v", c.Media.AllowDevices)
	}
	if d := DefaultConfig(); len(d.Media.AllowDevices) != 0 {
		t.Fatalf("by default only USB and MMC devices are read, not %v", d.Media.AllowDevices)
	}
}

func TestLoadConfig_MissingFile(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.toml")
	if _, err := LoadConfig(missing, true); !errors.Is(err, ErrConfig) {
		t.Fatalf("explicit missing file: %v", err)
	}
	c, err := LoadConfig(missing, false)
	if err != nil || c.Paths.StateDir != "/var/lib/ferry" {
		t.Fatalf("default missing file: %v %+v", err, c.Paths)
	}
}

func TestWriteConfig_RoundTrips(t *testing.T) {
	c := DefaultConfig()
	c.NodeName = "n1"
	c.ApprovedDigests = []string{"sha256:" + strings.Repeat("a", 64)}
	c.Peer.Peers = []string{"10.0.0.2:8090"}
	var b bytes.Buffer
	if err := WriteConfig(&b, c); err != nil {
		t.Fatal(err)
	}
	got, err := LoadConfig(writeConfig(t, b.String()), true)
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeName != "n1" || got.Peer.Peers[0] != "10.0.0.2:8090" || got.ApprovedDigests[0] != c.ApprovedDigests[0] {
		t.Fatalf("round trip lost data: %+v", got)
	}
}

func FuzzLoadConfig(f *testing.F) {
	f.Add("node_name = \"a\"\n[paths]\nstate_dir = \"/x\"\n")
	f.Add("[crio]\nreload = \"signal\"\npull_workers = 4\n")
	f.Add("approved_digests = [\"sha256:" + strings.Repeat("0", 64) + "\"]\n")
	f.Fuzz(func(t *testing.T, body string) {
		c, err := LoadConfig(writeConfig(t, body), true)
		if err == nil {
			if verr := c.Validate(); verr != nil {
				t.Fatalf("accepted an invalid config: %v", verr)
			}
		} else if !errors.Is(err, ErrConfig) {
			t.Fatalf("error without ErrConfig: %v", err)
		}
	})
}

func TestLoadConfig_ApprovalNamesTheAllowedModes(t *testing.T) {
	for _, mode := range machine.ApprovalModes {
		c, err := LoadConfig(writeConfig(t, "approval = \""+string(mode)+"\"\n"), true)
		if err != nil || c.Approval != mode {
			t.Fatalf("approval = %q: %v, got %q", mode, err, c.Approval)
		}
	}
	_, err := LoadConfig(writeConfig(t, "approval = \"digest\"\n"), true)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), `approval: "digest" is not an approval mode: use "required" or "off"`) {
		t.Fatalf("approval = \"digest\": %v", err)
	}
}
