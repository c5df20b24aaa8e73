package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadConfig_PeerIdentityNodeStandsAlone: with peer.identity =
// "node" the peers authenticate with the kubelet's certificates only: a
// token_file beside it (a second way in) or open is refused, as is node
// without the kubelet's kubeconfig; the node keys without it are a
// mistake too.
func TestLoadConfig_PeerIdentityNodeStandsAlone(t *testing.T) {
	const kc = "[cluster]\nkubeconfig = \"/var/lib/kubelet/kubeconfig\"\n"
	for _, c := range []struct{ body, key string }{
		{kc + "[peer]\nidentity = \"node\"\ntoken_file = \"/etc/ferry/peer-token\"\n", "peer.token_file"},
		{kc + "[peer]\nidentity = \"node\"\nopen = true\n", "peer.open"},
		{"[peer]\nidentity = \"node\"\n", "cluster.kubeconfig"},
		{kc + "[peer]\nidentity = \"kerberos\"\n", "peer.identity"},
		{kc + "[peer]\nidentity = \"node\"\nclient_ca = \"ca.crt\"\n", "peer.client_ca"},
		{kc + "[peer]\ncert = \"/var/lib/kubelet/pki/kubelet-server-current.pem\"\n", "peer.cert"},
	} {
		_, err := LoadConfig(writeConfig(t, c.body), true)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%q: error %v does not name %s", c.body, err, c.key)
		}
	}
	cfg, err := LoadConfig(writeConfig(t, kc+"[peer]\nidentity = \"node\"\n"), true)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Peer.NodeIdentity() || cfg.Peer.Closed() {
		t.Errorf("identity node: NodeIdentity %v, Closed %v; want true, false", cfg.Peer.NodeIdentity(), cfg.Peer.Closed())
	}
}

// TestLoadConfig_PeerIdentityDefaultsToNodeWithTheKubeletsCredential
// (issue 41): unset, peer.identity is "node" when cluster.kubeconfig
// authenticates with a client certificate (the kubelet's), and a
// token_file beside it is refused saying why and what to set; a token
// kubeconfig keeps "token", and an explicit "token" stays token.
func TestLoadConfig_PeerIdentityDefaultsToNodeWithTheKubeletsCredential(t *testing.T) {
	dir := t.TempDir()
	write := func(name, user string) string {
		p := filepath.Join(dir, name)
		body := "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n" +
			"clusters:\n- name: k\n  cluster: {server: 'https://api:6443'}\nusers:\n- name: u\n  user:\n    " + user + "\n"
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kubelet := write("kubelet", "client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem")
	token := write("token", "tokenFile: /var/lib/ferry/token")
	kc := func(p string) string { return "[cluster]\nkubeconfig = \"" + p + "\"\n" }
	for _, c := range []struct {
		name, body string
		node       bool
	}{
		{"the kubelet's", kc(kubelet), true},
		{"a token's", kc(token), false},
		{"the kubelet's, token explicit", kc(kubelet) + "[peer]\nidentity = \"token\"\ntoken_file = \"/etc/ferry/peer-token\"\n", false},
		{"none", "", false},
	} {
		cfg, err := LoadConfig(writeConfig(t, c.body), true)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if cfg.Peer.NodeIdentity() != c.node {
			t.Errorf("%s: identity %q, want node %v", c.name, cfg.Peer.Identity, c.node)
		}
	}
	_, err := LoadConfig(writeConfig(t, kc(kubelet)+"[peer]\ntoken_file = \"/etc/ferry/peer-token\"\n"), true)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "the default with cluster.kubeconfig") || !strings.Contains(err.Error(), `set identity = "token"`) {
		t.Errorf("a token_file beside the kubelet's kubeconfig: %v, want why node and what to set", err)
	}
}
