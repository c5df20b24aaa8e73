package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/peer"
)

var (
	digestA = digest.Digest("sha256:" + strings.Repeat("ab", 32))
	digestB = digest.Digest("sha256:" + strings.Repeat("cd", 32))
	t0      = time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)
)

// loadingStatus is a node loading a bundle, with something in every
// field status prints.
func loadingStatus() agent.Status {
	times := map[agent.Phase]time.Time{agent.PhaseDetected: t0, agent.PhaseExtracted: t0.Add(7 * time.Minute), agent.PhaseLoading: t0.Add(8 * time.Minute)}
	return agent.Status{
		Node: "master-0", Phase: string(agent.PhaseLoading), Bundle: "upgrade-4.13.7-x86_64.tar", Version: "4.13.7", Digest: digestA,
		Release:  "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat("ef", 32),
		Progress: &agent.Progress{Done: 120, Total: 183, Unit: "images"}, Healthy: true, Reason: agent.ReasonLoading,
		Error:  "upgrade-4.12.0-x86_64.tar: arch aarch64, want x86_64",
		Notice: "the stick holds the bundle already here", Warnings: []string{"cluster.kubeconfig: the API server's certificate is not verified"},
		Preflight: []string{"etcd backup older than a day"}, Times: times,
		Line: "loading upgrade-4.13.7-x86_64.tar: 120/183 images",
		Bundles: []agent.Record{
			{ID: "r1", Digest: digestA, Name: "upgrade-4.13.7-x86_64.tar", Origin: agent.OriginStick, Phase: agent.PhaseLoading,
				Progress: agent.Progress{Done: 120, Total: 183, Unit: "images"}, Times: times},
			{ID: "r0", Digest: digestB, Name: "upgrade-4.12.0-x86_64.tar", Origin: agent.OriginFile, Phase: agent.PhaseRejected,
				Condition: agent.Condition{Kind: agent.KindFault, Reason: agent.ReasonRefused, Message: "arch aarch64, want x86_64"},
				Progress:  agent.Progress{Done: 1 << 30, Total: 4 << 30, Unit: "bytes"}, Times: map[agent.Phase]time.Time{agent.PhaseRejected: t0.Add(-time.Hour)}},
		},
	}
}

// waitingCluster is three nodes seen from master-0, the peers in a map.
func waitingCluster() agent.ClusterStatus {
	return agent.ClusterStatus{
		Self: peer.Status{Node: "master-0", Phase: string(agent.PhaseLoaded), Digest: digestA, Version: "4.13.7", Source: true},
		Peers: map[string]agent.ClusterNode{
			"10.0.0.12:8443": {Status: peer.Status{Node: "master-2", Phase: string(agent.PhaseFetching), Digest: digestA, Version: "4.13.7", Progress: "6.7/16.0 GiB"}},
			"10.0.0.11:8443": {Status: peer.Status{Node: "master-1", Phase: string(agent.PhaseLoaded), Digest: digestA, Version: "4.13.7"}},
			"10.0.0.13:8443": {Unreachable: "dial tcp 10.0.0.13:8443: connect: no route to host"},
		},
		Decision: agent.Decision{Verdict: agent.Waiting, Digest: digestA, Message: "waiting for master-2, 10.0.0.13:8443",
			Waiting: []string{"master-2", "10.0.0.13:8443"}, Digests: map[digest.Digest][]string{digestA: {"master-0", "master-1", "master-2"}}},
	}
}

// inUTC prints times in UTC, whatever the machine's zone.
func inUTC(t *testing.T) {
	old := time.Local
	time.Local = time.UTC
	t.Cleanup(func() { time.Local = old })
}

func TestStatus_Golden(t *testing.T) {
	inUTC(t)
	for _, tc := range []struct{ format, file string }{
		{outText, "status.txt"}, {outWide, "status-wide.txt"}, {outJSON, "status.json"}, {outYAML, "status.yaml"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var b bytes.Buffer
			if err := writeStatus(&b, loadingStatus(), tc.format); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, b.Bytes())
		})
	}
}

func TestStatusCluster_Golden(t *testing.T) {
	for _, tc := range []struct{ format, file string }{
		{outText, "cluster.txt"}, {outWide, "cluster-wide.txt"}, {outJSON, "cluster.json"}, {outYAML, "cluster.yaml"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var b bytes.Buffer
			if err := writeCluster(&b, waitingCluster(), tc.format); err != nil {
				t.Fatal(err)
			}
			if tc.format == outText {
				writeNodeAnnotations(&b, "https://api.site.example:6443", map[string]map[string]string{
					"master-1": {agent.AnnotationPhase: "loaded", agent.AnnotationBundle: "4.13.7"},
					"master-0": {agent.AnnotationPhase: "loaded", agent.AnnotationBundle: "4.13.7"},
				}, nil)
				writeBundleNodes(&b, []kube.NodeBundle{
					{Node: "master-0", Bundle: "4.13.7-x86-64", Entry: cluster.BundleNodeEntry{Phase: "loaded", Digest: digestA, Reason: "Loaded"}},
					{Node: "master-0", Bundle: "4.13.6-x86-64", Entry: cluster.BundleNodeEntry{Phase: "upgraded", Reason: "Upgraded"}},
					{Node: "master-1", Bundle: "4.13.7-x86-64", Entry: cluster.BundleNodeEntry{Phase: "fetching", Reason: "Fetching", Message: "fetching from master-0"}},
				}, nil)
			}
			golden(t, tc.file, b.Bytes())
		})
	}
}

// Go's maps have no order: the peers come by name on every run.
func TestStatusCluster_PeersComeByName(t *testing.T) {
	for range 20 {
		var b bytes.Buffer
		writeCluster(&b, waitingCluster(), outText)
		out := b.String()
		i0, i1, i2, i3 := strings.Index(out, "master-0"), strings.Index(out, "master-1"), strings.Index(out, "master-2"), strings.Index(out, "10.0.0.13:8443")
		if !(i0 < i3 && i3 < i1 && i1 < i2) {
			t.Fatalf("want this node, then the peers by name (an unnamed one by its address):\n%s", out)
		}
	}
}

// The YAML is the JSON by another notation: the same fields by the same
// names, the same values.
func TestWriteObject_YAMLHoldsWhatTheJSONHolds(t *testing.T) {
	for _, v := range []any{loadingStatus(), waitingCluster()} {
		var j, y bytes.Buffer
		if err := writeObject(&j, v, outJSON); err != nil {
			t.Fatal(err)
		}
		if err := writeObject(&y, v, outYAML); err != nil {
			t.Fatal(err)
		}
		var fromJSON, fromYAML any
		if err := json.Unmarshal(j.Bytes(), &fromJSON); err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(y.Bytes(), &fromYAML); err != nil {
			t.Fatal(err)
		}
		// Through JSON again: YAML's ints and JSON's float64s compare equal.
		a, _ := json.Marshal(fromJSON)
		b, _ := json.Marshal(fromYAML)
		if !bytes.Equal(a, b) {
			t.Errorf("the YAML differs from the JSON:\njson: %s\nyaml: %s", a, b)
		}
	}
}

func TestStatus_RefusesAnUnknownOutput(t *testing.T) {
	code, _, stderr := ferry(t, "status", "-o", "xml")
	if code != exitUsage || !strings.Contains(stderr, `-o "xml": want json, yaml, wide`) {
		t.Fatalf("exit %d: %s", code, stderr)
	}
}

// config check -o json|yaml shows the config file's keys, not Go's names.
func TestConfigCheck_ObjectsUseTheConfigFilesKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("node_name = \"master-0\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for format, want := range map[string]string{"json": `"node_name": "master-0"`, "yaml": "\nnode_name: master-0\n"} {
		code, stdout, stderr := ferry(t, "config", "check", "--config", path, "-o", format)
		if code != 0 || !strings.Contains(stdout, want) || !strings.Contains(stdout, "extract_dir") {
			t.Errorf("-o %s: exit %d, want %q:\n%s%s", format, code, want, stdout, stderr)
		}
	}
}
