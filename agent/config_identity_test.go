package agent

import (
	"errors"
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
