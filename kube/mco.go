package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/ferry-edge/ferry/cluster"
)

// The machine config operator's annotations on a Node, written by its
// daemon (MCD) on the node.
const (
	MCOCurrentConfig = "machineconfiguration.openshift.io/currentConfig"
	MCODesiredConfig = "machineconfiguration.openshift.io/desiredConfig"
	MCOState         = "machineconfiguration.openshift.io/state"
	MCOReason        = "machineconfiguration.openshift.io/reason"
	poolsPath        = "/apis/machineconfiguration.openshift.io/v1/machineconfigpools"
)

// MachineConfigState reads the Node named node and, when the machine
// config operator manages it, the MachineConfigPools (a cluster without
// their CRD has no pool).
func (c *Client) MachineConfigState(ctx context.Context, node string) (cluster.NodeUpdate, error) {
	var n mcoNode
	if err := c.do(ctx, "GET", "/api/v1/nodes/"+url.PathEscape(node), "", nil, &n); err != nil {
		return cluster.NodeUpdate{}, fmt.Errorf("reading node %s: %w", node, err)
	}
	return n.state(ctx, c.pools)
}

// mcoKey is what MachineConfigState reads of a Node, as one string: the
// MCO's annotations and the labels, but ferry's own (ferry.io/*, which
// ferry writes at each phase and no pool selects on).
func mcoKey(raw json.RawMessage) string {
	var n mcoNode
	if json.Unmarshal(raw, &n) != nil {
		return string(raw)
	}
	var b strings.Builder
	for _, k := range []string{MCOCurrentConfig, MCODesiredConfig, MCOState, MCOReason} {
		b.WriteString(n.Metadata.Annotations[k] + "\x00")
	}
	for _, k := range slices.Sorted(maps.Keys(n.Metadata.Labels)) {
		if !strings.HasPrefix(k, "ferry.io/") {
			b.WriteString(k + "=" + n.Metadata.Labels[k] + "\x00")
		}
	}
	return b.String()
}

// poolLabels are a node's labels a pool may select on: all but ferry's
// own (a copy).
func poolLabels(labels map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range labels {
		if !strings.HasPrefix(k, "ferry.io/") {
			out[k] = v
		}
	}
	return out
}

// mcoNode is what the MCO's state of a node is read from.
type mcoNode struct {
	Metadata struct {
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
}

// state is the MCO's state of n, with the pools from pools when the MCO
// manages it.
func (n *mcoNode) state(ctx context.Context, pools func(context.Context) ([]pool, error)) (cluster.NodeUpdate, error) {
	a := n.Metadata.Annotations
	var st cluster.NodeUpdate
	for _, k := range []string{MCOCurrentConfig, MCODesiredConfig, MCOState} {
		if _, ok := a[k]; ok {
			st.Managed = true
		}
	}
	if !st.Managed {
		return st, nil
	}
	st.State, st.Current, st.Desired, st.Reason = a[MCOState], a[MCOCurrentConfig], a[MCODesiredConfig], a[MCOReason]
	ps, err := pools(ctx)
	if err != nil {
		return st, err
	}
	if p := poolOf(ps, n.Metadata.Labels); p != nil {
		st.Pool, st.Paused, st.Target = p.Metadata.Name, p.Spec.Paused, p.Spec.Configuration.Name
	}
	return st, nil
}

// pools lists the MachineConfigPools (none without their CRD).
func (c *Client) pools(ctx context.Context) ([]pool, error) {
	var list struct {
		Items []pool `json:"items"`
	}
	err := c.do(ctx, "GET", poolsPath, "", nil, &list)
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the machine config pools: %w", err)
	}
	return list.Items, nil
}

// namedPool reads the MachineConfigPool name (nil when there is none).
func (c *Client) namedPool(ctx context.Context, name string) (*pool, error) {
	var p pool
	err := c.do(ctx, "GET", poolsPath+"/"+url.PathEscape(name), "", nil, &p)
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the machine config pool %s: %w", name, err)
	}
	return &p, nil
}

type pool struct {
	Metadata struct {
		Name        string            `json:"name"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		NodeSelector  *labelSelector `json:"nodeSelector"`
		Paused        bool           `json:"paused"`
		Configuration struct {
			Name string `json:"name"`
		} `json:"configuration"`
	} `json:"spec"`
	Status struct {
		MachineCount int `json:"machineCount"`
	} `json:"status"`
}

// MachineCount is how many nodes the machine config operator counts: the
// sum of its pools' status.machineCount (a node is in exactly one pool).
// It counts the nodes ferry does not run on too, which no Lease names;
// known is false without pools (no MCO: not OpenShift).
func (c *Client) MachineCount(ctx context.Context) (n int, known bool, err error) {
	return machineCount(c.pools(ctx))
}

func machineCount(ps []pool, err error) (int, bool, error) {
	if err != nil || len(ps) == 0 {
		return 0, false, err
	}
	n := 0
	for _, p := range ps {
		n += p.Status.MachineCount
	}
	return n, true, nil
}

type labelSelector struct {
	MatchLabels      map[string]string `json:"matchLabels"`
	MatchExpressions []struct {
		Key      string   `json:"key"`
		Operator string   `json:"operator"`
		Values   []string `json:"values"`
	} `json:"matchExpressions"`
}

// poolOf is the pool a node with these labels is in, as the MCO picks
// it: a custom pool's nodes also match worker's selector, and the custom
// pool wins; master wins over any other.
func poolOf(pools []pool, labels map[string]string) *pool {
	var in []*pool
	for i := range pools {
		if pools[i].Spec.NodeSelector.matches(labels) {
			in = append(in, &pools[i])
		}
	}
	if len(in) > 1 {
		in = slices.DeleteFunc(in, func(p *pool) bool { return p.Metadata.Name == "worker" })
	}
	for _, p := range in {
		if p.Metadata.Name == "master" {
			return p
		}
	}
	slices.SortFunc(in, func(a, b *pool) int { return strings.Compare(a.Metadata.Name, b.Metadata.Name) })
	if len(in) == 0 {
		return nil
	}
	return in[0]
}

// matches is a Kubernetes label selector's meaning: nil selects nothing,
// an empty one everything.
func (s *labelSelector) matches(labels map[string]string) bool {
	if s == nil {
		return false
	}
	for k, v := range s.MatchLabels {
		if have, ok := labels[k]; !ok || have != v {
			return false
		}
	}
	for _, e := range s.MatchExpressions {
		v, ok := labels[e.Key]
		switch e.Operator {
		case "In":
			if !ok || !slices.Contains(e.Values, v) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(e.Values, v) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}
