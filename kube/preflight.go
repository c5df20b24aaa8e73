package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/hop"
)

const (
	clusterOperatorsPath = "/apis/config.openshift.io/v1/clusteroperators"
	adminGatesPath       = "/api/v1/namespaces/openshift-config-managed/configmaps/admin-gates"
	adminAcksPath        = "/api/v1/namespaces/openshift-config/configmaps/admin-acks"
	// maxListed bounds each list a preflight line names.
	maxListed = 10
)

// Preflight checks the bundle's version, target, against ClusterVersion (a
// downgrade, the same version and a skipped minor are refused; a minor
// update is refused while Upgradeable=False or an admin-ack the cluster
// requires is not given) and warns of paused pools, degraded or
// unavailable cluster operators, and workloads on node that pull, with
// imagePullPolicy Always, images the bundle does not carry. A resource a
// cluster lacks (no MCO, no ClusterOperator CRD) is skipped. images are
// every reference the bundle holds (name[:tag]@sha256:…), the release
// included.
func (c *Client) Preflight(ctx context.Context, node, target string, images []string) (cluster.Preflight, error) {
	var p cluster.Preflight
	cv, err := c.clusterVersion(ctx)
	if err != nil {
		return p, fmt.Errorf("reading clusterversion/version: %w", err)
	}
	p.Current = cv.current()
	if err := c.checkVersion(ctx, &p, cv, target); err != nil {
		return p, err
	}
	if err := c.checkPools(ctx, &p); err != nil {
		return p, err
	}
	if err := c.checkOperators(ctx, &p); err != nil {
		return p, err
	}
	if err := c.checkAlwaysPull(ctx, &p, node, images); err != nil {
		return p, err
	}
	return p, nil
}

// PreflightPath is Preflight for a bundle's path (each hop's version, in
// order): every hop must be one the version operator accepts after the
// one before, from the cluster's version (a gap is refused naming the
// missing minor), and the first hop passes Preflight's checks; each
// later hop's Upgradeable and admin-acks are checked when it is asked
// (AdvancePath), since the release before it sets them.
func (c *Client) PreflightPath(ctx context.Context, node string, path []string, images []string) (cluster.Preflight, error) {
	p, err := c.Preflight(ctx, node, path[0], images)
	if err != nil || len(p.Refusals) > 0 || len(path) == 1 {
		return p, err
	}
	if err := hop.CheckPath(path[0], path[1:]); err != nil {
		p.Refusals = append(p.Refusals, fmt.Sprintf("the bundle's path %s: %s", strings.Join(path, " → "), strings.TrimPrefix(err.Error(), hop.ErrRefused.Error()+": ")))
	}
	return p, nil
}

// current is the cluster's version: the newest Completed history entry's,
// else what it is moving to.
func (cv *clusterVersion) current() string {
	for _, h := range cv.Status.History {
		if h.State == "Completed" {
			return h.Version
		}
	}
	return cv.Status.Desired.Version
}

func (c *Client) checkVersion(ctx context.Context, p *cluster.Preflight, cv *clusterVersion, target string) error {
	cur, okCur := hop.Parse(p.Current)
	to, okTo := hop.Parse(target)
	if !okCur || !okTo {
		p.Warnings = append(p.Warnings, fmt.Sprintf("cannot compare the bundle's version %q with the cluster's %q", target, p.Current))
		return nil
	}
	switch cmp := to.Compare(cur); {
	case cmp == 0:
		p.Refusals = append(p.Refusals, fmt.Sprintf("the cluster is at %s already: this bundle would change nothing", p.Current))
		return nil
	case cmp < 0:
		p.Refusals = append(p.Refusals, fmt.Sprintf("%s is older than the cluster's %s: OpenShift does not downgrade; bring a newer bundle", target, p.Current))
		return nil
	}
	if err := hop.Check(p.Current, target); err != nil {
		p.Refusals = append(p.Refusals, strings.TrimPrefix(err.Error(), hop.ErrRefused.Error()+": "))
		return nil
	}
	if !cur.IsMinorUpdate(to) {
		return nil // a z-stream update: Upgradeable and admin-acks do not apply
	}
	if u := cv.condition("Upgradeable"); u != nil && u.Status == "False" {
		p.Refusals = append(p.Refusals, fmt.Sprintf("the cluster is not upgradeable to a new minor version (Upgradeable=False, %s): %s", u.Reason, u.Message))
	}
	return c.checkAdminAcks(ctx, p, cur)
}

// adminGateRE is the version operator's admin gate name: ack-<major.minor
// the cluster is at>-<name>.
var adminGateRE = regexp.MustCompile(`^ack-([4-5][.][0-9]{1,})-[^-]`)

// checkAdminAcks refuses a minor update while an admin gate of the
// cluster's current minor is not acknowledged ("true" in admin-acks).
func (c *Client) checkAdminAcks(ctx context.Context, p *cluster.Preflight, cur hop.Version) error {
	var gates, acks configMapData
	if err := c.do(ctx, "GET", adminGatesPath, "", nil, &gates); err != nil && !IsNotFound(err) {
		return fmt.Errorf("reading openshift-config-managed/admin-gates: %w", err)
	}
	if err := c.do(ctx, "GET", adminAcksPath, "", nil, &acks); err != nil && !IsNotFound(err) {
		return fmt.Errorf("reading openshift-config/admin-acks: %w", err)
	}
	var missing, names []string
	for gate, what := range gates.Data {
		m := adminGateRE.FindStringSubmatch(gate)
		if m == nil || m[1] != cur.MinorOf() || acks.Data[gate] == "true" {
			continue
		}
		missing = append(missing, fmt.Sprintf("%s (%s)", gate, what))
		names = append(names, gate)
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		slices.Sort(names)
		// The command names the gates, so that a person can run it as
		// it is, once they have read what each one asks of them.
		data := map[string]string{}
		for _, n := range names {
			data[n] = "true"
		}
		patch, _ := json.Marshal(map[string]any{"data": data})
		p.Refusals = append(p.Refusals, "the cluster requires an administrator's acknowledgement first: "+strings.Join(missing, "; ")+
			": once done what it asks, give it with oc -n openshift-config patch cm admin-acks --type=merge -p '"+string(patch)+"'")
	}
	return nil
}

type configMapData struct {
	Data map[string]string `json:"data"`
}

func (c *Client) checkPools(ctx context.Context, p *cluster.Preflight) error {
	var list struct {
		Items []pool `json:"items"`
	}
	err := c.do(ctx, "GET", poolsPath, "", nil, &list)
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing the machine config pools: %w", err)
	}
	var paused []string
	for _, pl := range list.Items {
		if pl.Spec.Paused {
			paused = append(paused, pl.Metadata.Name)
		}
	}
	if len(paused) > 0 {
		p.Warnings = append(p.Warnings, fmt.Sprintf("machine config pool %s is paused: its nodes keep the old version (and ferry's mirror) until it is unpaused", strings.Join(paused, ", ")))
	}
	return nil
}

func (c *Client) checkOperators(ctx context.Context, p *cluster.Preflight) error {
	var list struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Status struct {
				Conditions []condition `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	err := c.do(ctx, "GET", clusterOperatorsPath, "", nil, &list)
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing the cluster operators: %w", err)
	}
	var bad []string
	for _, co := range list.Items {
		for _, cond := range co.Status.Conditions {
			if cond.Type == "Degraded" && cond.Status == "True" || cond.Type == "Available" && cond.Status == "False" {
				state := "degraded"
				if cond.Type == "Available" {
					state = "unavailable"
				}
				bad = append(bad, fmt.Sprintf("%s is %s: %s", co.Metadata.Name, state, cond.Message))
			}
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		p.Warnings = append(p.Warnings, "cluster operators are not healthy (the upgrade may stall on them): "+listed(bad))
	}
	return nil
}

// checkAlwaysPull warns of the containers on node that pull with
// imagePullPolicy Always an image the bundle does not carry: with no
// registry reachable, they fail to start wherever they are restarted
// during the upgrade. A kubelet's credential lists only its own node's
// pods; and since the warning goes into the cluster-scoped UpgradeBundle,
// it names images and counts, never a tenant's namespace or pod (those
// are in Preflight.Details, for the node's own journal).
func (c *Client) checkAlwaysPull(ctx context.Context, p *cluster.Preflight, node string, images []string) error {
	carried := map[string]bool{}
	for _, ref := range images {
		name, rest, _ := strings.Cut(ref, "@")
		carried[ref], carried[name] = true, true
		if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
			carried[name[:i]+"@"+rest] = true
		}
	}
	var list struct {
		Items []struct {
			Metadata struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Containers     []podContainer `json:"containers"`
				InitContainers []podContainer `json:"initContainers"`
			} `json:"spec"`
		} `json:"items"`
	}
	q := url.Values{"fieldSelector": {"spec.nodeName=" + node}}
	if err := c.do(ctx, "GET", "/api/v1/pods?"+q.Encode(), "", nil, &list); err != nil {
		return fmt.Errorf("listing the pods of node %s: %w", node, err)
	}
	containers, imgs := 0, map[string]bool{}
	var details []string
	for _, pod := range list.Items {
		for _, ct := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
			if ct.ImagePullPolicy == "Always" && !carried[ct.Image] {
				containers++
				imgs[ct.Image] = true
				details = append(details, fmt.Sprintf("%s/%s/%s (%s)", pod.Metadata.Namespace, pod.Metadata.Name, ct.Name, ct.Image))
			}
		}
	}
	if containers > 0 {
		slices.Sort(details)
		p.Details = append(p.Details, details...)
		what := fmt.Sprintf("%d containers on node %s pull", containers, node)
		if containers == 1 {
			what = "1 container on node " + node + " pulls"
		}
		p.Warnings = append(p.Warnings, what+" with imagePullPolicy Always an image the bundle does not carry, which cannot start if restarted without a registry (which pods: journalctl -u ferry on that node): "+
			listed(slices.Sorted(maps.Keys(imgs))))
	}
	return nil
}

type podContainer struct {
	Name            string `json:"name"`
	Image           string `json:"image"`
	ImagePullPolicy string `json:"imagePullPolicy"`
}

// listed joins items, naming at most maxListed of them.
func listed(items []string) string {
	if len(items) <= maxListed {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:maxListed], ", ") + fmt.Sprintf(" and %d more", len(items)-maxListed)
}
