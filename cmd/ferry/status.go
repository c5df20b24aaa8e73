package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/spf13/cobra"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/sha256digest"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/localapi"
	"github.com/ferry-edge/ferry/peer"
)

type statusOptions struct {
	nodeOptions
	output  outputFlag
	cluster bool
}

func newStatusCmd() *cobra.Command {
	o := &statusOptions{}
	c := nodeCmd("status", "show what the agent is doing", false, &o.nodeOptions,
		func(ctx context.Context, w io.Writer, cfg agent.Config, _ []string) error {
			return runStatus(ctx, w, cfg, o)
		})
	o.output.add(c, outJSON, outYAML, outWide)
	c.Flags().BoolVar(&o.cluster, "cluster", false, "show every node's phase and the cluster gate")
	return c
}

// runStatus asks the agent over its socket and prints the answer; an
// unhealthy node, or a cluster in conflict, is exit 1 after it.
func runStatus(ctx context.Context, w io.Writer, cfg agent.Config, o *statusOptions) error {
	client := localapi.NewClient(cfg.Paths.Socket)
	format := o.output.format
	if o.cluster {
		cs, err := client.Cluster(ctx)
		if err != nil {
			return err
		}
		if err := writeCluster(w, cs, format); err != nil {
			return err
		}
		if !isObject(format) && cfg.Cluster.Kubeconfig != "" {
			server, nodes, err := nodeAnnotations(ctx, cfg)
			writeNodeAnnotations(w, server, nodes, err)
			if err == nil {
				entries, err := bundleNodes(ctx, cfg)
				writeBundleNodes(w, entries, err)
			}
		}
		if cs.Decision.Verdict == agent.Conflict {
			return fmt.Errorf("%s", cs.Decision.Message)
		}
		return nil
	}
	s, err := client.Status(ctx)
	if err != nil {
		return err
	}
	if err := writeStatus(w, s, format); err != nil {
		return err
	}
	if !s.Healthy {
		return fmt.Errorf("%s", s.Line)
	}
	return nil
}

// statusPhases are the phases whose times status lists, in their order.
var statusPhases = []agent.Phase{agent.PhaseDetected, agent.PhaseFetching, agent.PhaseExtracted, agent.PhaseLoading,
	agent.PhaseLoaded, agent.PhaseClusterReady, agent.PhaseUpgrading, agent.PhaseUpgraded}

// writeStatus prints this node's status in format; wide adds every
// bundle record as a table.
func writeStatus(w io.Writer, s agent.Status, format string) error {
	if isObject(format) {
		return writeObject(w, s, format)
	}
	fmt.Fprintf(w, "node:    %s\nstatus:  %s\n", s.Node, s.Line)
	if s.Bundle != "" {
		fmt.Fprintf(w, "bundle:  %s (%s)\nphase:   %s\n", s.Bundle, s.Digest, s.Phase)
	}
	fmt.Fprintf(w, "reason:  %s\n", s.Reason)
	if s.Error != "" && s.Healthy {
		fmt.Fprintf(w, "last refusal: %s\n", s.Error)
	}
	if s.ClusterMessage != "" {
		fmt.Fprintf(w, "cluster: %s\n", s.ClusterMessage)
	}
	if s.Notice != "" {
		fmt.Fprintf(w, "note:    %s\n", s.Notice)
	}
	for _, l := range s.Warnings {
		fmt.Fprintf(w, "WARNING: %s\n", l)
	}
	for _, l := range s.SignaturePolicy {
		fmt.Fprintf(w, "WARNING: %s\n", l)
	}
	for _, l := range s.Preflight {
		fmt.Fprintf(w, "WARNING: the cluster's preflight: %s\n", l)
	}
	for _, p := range statusPhases {
		if t, ok := s.Times[p]; ok {
			fmt.Fprintf(w, "  %-14s %s\n", p, t.Local().Format("2006-01-02 15:04:05"))
		}
	}
	if format == outWide && len(s.Bundles) > 0 {
		fmt.Fprintln(w)
		t := newTable(w)
		fmt.Fprintln(t, "BUNDLE\tORIGIN\tPHASE\tDIGEST\tPROGRESS\tREASON\tMESSAGE")
		for _, r := range s.Bundles {
			fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.Origin, r.Phase, shortDigest(string(r.Digest)),
				progressText(r.Progress), cmp.Or(r.Condition.Reason, "-"), cmp.Or(r.Condition.Message, "-"))
		}
		return t.Flush()
	}
	return nil
}

// progressText is a record's progress in words ("1.2 GiB/4.0 GiB",
// "12/183 images"), "-" when none.
func progressText(p agent.Progress) string {
	switch {
	case p.Total <= 0:
		return "-"
	case p.Unit == "bytes":
		return bundle.HumanSize(p.Done) + "/" + bundle.HumanSize(p.Total)
	}
	return fmt.Sprintf("%d/%d %s", p.Done, p.Total, p.Unit)
}

func shortDigest(d string) string {
	if d == "" {
		return "-"
	}
	return sha256digest.Short(d)
}

// writeCluster prints every node's phase and the gate's verdict in
// format: this node first, then the peers by name (the agent keeps them
// in a map, by address); wide adds their address and version.
func writeCluster(w io.Writer, cs agent.ClusterStatus, format string) error {
	if isObject(format) {
		return writeObject(w, cs, format)
	}
	wide := format == outWide
	t := newTable(w)
	if wide {
		fmt.Fprintln(t, "NODE\tADDRESS\tPHASE\tVERSION\tDIGEST\tPROGRESS\tNOTE")
	} else {
		fmt.Fprintln(t, "NODE\tPHASE\tDIGEST\tPROGRESS\tNOTE")
	}
	row := func(name, addr string, s peer.Status, note string) {
		if wide {
			fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, addr, cmp.Or(s.Phase, "-"), cmp.Or(s.Version, "-"), shortDigest(string(s.Digest)), cmp.Or(s.Progress, "-"), cmp.Or(note, "-"))
		} else {
			fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\n", name, cmp.Or(s.Phase, "-"), shortDigest(string(s.Digest)), cmp.Or(s.Progress, "-"), cmp.Or(note, "-"))
		}
	}
	row(cs.Self.Node+" (this node)", "-", cs.Self, cs.Self.Error)
	name := func(addr string) string { return cmp.Or(cs.Peers[addr].Node, addr) }
	addrs := slices.SortedFunc(maps.Keys(cs.Peers), func(a, b string) int {
		return cmp.Or(cmp.Compare(name(a), name(b)), cmp.Compare(a, b))
	})
	for _, addr := range addrs {
		p := cs.Peers[addr]
		note := p.Error
		if p.Unreachable != "" {
			note = "unreachable: " + p.Unreachable
		}
		row(name(addr), addr, p.Status, note)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\ncluster: %s — %s\n", cs.Decision.Verdict, cs.Decision.Message)
	return err
}

// writeNodeAnnotations prints every Node's ferry.io annotations, as an
// administrator sees them with oc get nodes, by node name; or why the
// API could not be read.
func writeNodeAnnotations(w io.Writer, server string, nodes map[string]map[string]string, err error) {
	if err != nil {
		fmt.Fprintf(w, "\nthe cluster's API cannot be read: %v\n", err)
		return
	}
	fmt.Fprintf(w, "\nin the cluster's API (%s):\n", server)
	t := newTable(w)
	fmt.Fprintln(t, "NODE\tPHASE\tBUNDLE\tPROGRESS\tREASON")
	for _, n := range slices.Sorted(maps.Keys(nodes)) {
		a := nodes[n]
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\n", n, cmp.Or(a[agent.AnnotationPhase], "-"), cmp.Or(a[agent.AnnotationBundle], "-"),
			cmp.Or(a[agent.AnnotationProgress], "-"), cmp.Or(a[agent.AnnotationReason], "-"))
	}
	t.Flush()
}

// writeBundleNodes prints every node's entry for each UpgradeBundle it
// knows (its UpgradeBundleNode), as oc get upgradebundlenodes shows them,
// by node name, then each node's newest first; or why they could not be
// read.
func writeBundleNodes(w io.Writer, entries []kube.NodeBundle, err error) {
	if err != nil {
		fmt.Fprintf(w, "\nthe nodes' UpgradeBundleNodes cannot be read: %v\n", err)
		return
	}
	if len(entries) == 0 {
		return
	}
	fmt.Fprintln(w, "\nevery node's entries (oc get upgradebundlenodes):")
	t := newTable(w)
	fmt.Fprintln(t, "NODE\tBUNDLE\tPHASE\tDIGEST\tREASON\tMESSAGE")
	for _, e := range entries {
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Node, e.Bundle, cmp.Or(e.Entry.Phase, "-"), shortDigest(string(e.Entry.Digest)),
			cmp.Or(e.Entry.Reason, "-"), cmp.Or(e.Entry.Message, "-"))
	}
	t.Flush()
}
