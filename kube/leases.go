package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/ferry-edge/ferry/cluster"
)

// Each node's record of itself for the other nodes (docs/design.md,
// "Peers"): a Lease in openshift-ferry named after the node, owned by its
// Node (the garbage collector deletes it with the Node), with the node's
// peer address and readiness as annotations. A kubelet may read only its
// own Node and its own pods; the Leases are how the nodes find each other.
const (
	LeaseNamespace = "openshift-ferry"
	leasesPath     = "/apis/coordination.k8s.io/v1/namespaces/" + LeaseNamespace + "/leases"

	AnnotationAddress    = "ferry.io/address"     // the node's InternalIP (or its peer listen host)
	AnnotationReady      = "ferry.io/ready"       // "true" or "false": its Node's Ready condition
	AnnotationReadySince = "ferry.io/ready-since" // RFC3339: when that condition last changed
	AnnotationBundle     = "ferry.io/bundle"      // the UpgradeBundle the node reports on (once it wrote its entry there)

	leaseSeconds = 900
)

// leaseRenew is how often an unchanged record is written again: well
// within leaseSeconds, so a running node never looks gone (a variable
// for the tests). Every node watches every record, so each renewal is an
// event to every node: N nodes cost each node N renewals a leaseRenew. A
// change (address, readiness, the bundle reported on) is written at once;
// the renewal only tells a node that is gone (its record expires) from
// one that is there, which nothing needs within minutes (the gate waits
// on the peers' own answers; notReadyTimeout is tens of minutes).
var leaseRenew = 5 * time.Minute

// microTime is the format of a Lease's times (metav1.MicroTime).
const microTime = "2006-01-02T15:04:05.000000Z07:00"

type ownerRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
}

type lease struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace,omitempty"`
		ResourceVersion string            `json:"resourceVersion,omitempty"`
		Annotations     map[string]string `json:"annotations,omitempty"`
		OwnerReferences []ownerRef        `json:"ownerReferences,omitempty"`
	} `json:"metadata"`
	Spec struct {
		HolderIdentity       string `json:"holderIdentity,omitempty"`
		LeaseDurationSeconds int    `json:"leaseDurationSeconds,omitempty"`
		RenewTime            string `json:"renewTime,omitempty"`
	} `json:"spec"`
}

// record is what a node says of itself in its Lease.
type record struct {
	address    string
	ready      bool
	readySince time.Time
	uid        string // its Node's, the Lease's owner
	bundle     string // the UpgradeBundle it reports on ("" none yet)
}

// recordOf is what node n says of itself: address, when not "", is the
// peer listen host configured explicitly, else n's InternalIP.
func recordOf(n *node, address string) record {
	r := record{address: address, uid: n.Metadata.UID, readySince: n.Metadata.CreationTimestamp}
	if r.address == "" {
		r.address = internalIP(n)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == "Ready" {
			r.ready, r.readySince = c.Status == "True", c.LastTransitionTime
		}
	}
	return r
}

// leaseOf is the Lease that says r of node, renewed at now.
func leaseOf(node string, r record, now time.Time) lease {
	var l lease
	l.APIVersion, l.Kind = "coordination.k8s.io/v1", "Lease"
	l.Metadata.Name, l.Metadata.Namespace = node, LeaseNamespace
	l.Metadata.Annotations = map[string]string{
		AnnotationAddress:    r.address,
		AnnotationReady:      strconv.FormatBool(r.ready),
		AnnotationReadySince: r.readySince.UTC().Format(time.RFC3339),
	}
	if r.bundle != "" {
		l.Metadata.Annotations[AnnotationBundle] = r.bundle
	}
	l.Metadata.OwnerReferences = []ownerRef{{APIVersion: "v1", Kind: "Node", Name: node, UID: r.uid}}
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = node, leaseSeconds
	l.Spec.RenewTime = now.UTC().Format(microTime)
	return l
}

// renewed is when l was last written (zero when it does not say).
func (l *lease) renewed() time.Time {
	t, _ := time.Parse(time.RFC3339Nano, l.Spec.RenewTime)
	return t
}

// valid tells whether l is a node's record of itself: named after its
// holder (the ferry-lease admission policy allows no other).
func (l *lease) valid() bool {
	return l.Metadata.Name != "" && l.Spec.HolderIdentity == l.Metadata.Name
}

// addressesOfLeases maps each node with a record to its address.
func addressesOfLeases(ls []lease) map[string]string {
	out := map[string]string{}
	for _, l := range ls {
		if l.valid() {
			out[l.Metadata.Name] = l.Metadata.Annotations[AnnotationAddress]
		}
	}
	return out
}

// readinessOfLeases is each node's readiness as its record says at now:
// ready when it says so and was renewed within its duration; a record
// that expired is not ready since it expired (or since it said so, when
// that was earlier).
func readinessOfLeases(ls []lease, now time.Time) map[string]cluster.NodeReady {
	out := map[string]cluster.NodeReady{}
	for _, l := range ls {
		if !l.valid() {
			continue
		}
		since, _ := time.Parse(time.RFC3339, l.Metadata.Annotations[AnnotationReadySince])
		says := l.Metadata.Annotations[AnnotationReady] == "true"
		expires := l.renewed().Add(time.Duration(l.Spec.LeaseDurationSeconds) * time.Second)
		reports := l.Metadata.Annotations[AnnotationBundle]
		r := cluster.NodeReady{Ready: says, Since: since, Reports: reports}
		if !now.Before(expires) {
			// Not ready since it expired, or since it said so before.
			r = cluster.NodeReady{Ready: false, Since: expires, Reports: reports}
			if !says && since.Before(expires) {
				r.Since = since
			}
		}
		out[l.Metadata.Name] = r
	}
	return out
}

func (c *Client) listLeases(ctx context.Context) ([]lease, error) {
	var list struct {
		Items []lease `json:"items"`
	}
	if err := c.do(ctx, "GET", leasesPath, "", nil, &list); err != nil {
		return nil, fmt.Errorf("listing the nodes' records (leases in %s): %w", LeaseNamespace, err)
	}
	return list.Items, nil
}

// NodeAddresses maps the name of every node with a record (a Lease in
// openshift-ferry: a node without ferry, or whose Node was deleted, has
// none) to its peer address.
func (c *Client) NodeAddresses(ctx context.Context) (map[string]string, error) {
	ls, err := c.listLeases(ctx)
	return addressesOfLeases(ls), err
}

// NodeReadiness is the readiness of every node with a record, by node
// name (readinessOfLeases).
func (c *Client) NodeReadiness(ctx context.Context) (map[string]cluster.NodeReady, error) {
	ls, err := c.listLeases(ctx)
	return readinessOfLeases(ls, time.Now()), err
}

// writeLease creates node's Lease, or replaces old (its resourceVersion
// guards against a write in between: a conflict is read again).
func (c *Client) writeLease(ctx context.Context, old *lease, l lease) error {
	if old == nil {
		return c.do(ctx, "POST", leasesPath, jsonType, l, nil)
	}
	l.Metadata.ResourceVersion = old.Metadata.ResourceVersion
	return c.do(ctx, "PUT", leasesPath+"/"+url.PathEscape(l.Metadata.Name), jsonType, l, nil)
}

// KeepRecord writes this node's Lease from its own Node as the Follower
// sees it, again when its address or readiness changes and every
// leaseRenew, until ctx ends. address, when not "", is the peer listen
// host configured explicitly (the InternalIP otherwise).
func (f *Follower) KeepRecord(ctx context.Context, address string) {
	var written time.Time
	var wrote record
	retry, lastErr := time.Duration(0), ""
	var notBefore time.Time // after a failure, a change waits out the backoff
	for {
		changes := f.Changes()
		wait := leaseRenew
		if rec, ok := f.ownRecord(address); ok {
			if (written.IsZero() || rec != wrote || time.Since(written) >= leaseRenew) && !time.Now().Before(notBefore) {
				now := time.Now()
				err := f.c.writeLease(ctx, f.ownLease(), leaseOf(f.node, rec, now))
				switch {
				case err == nil:
					written, wrote, retry, lastErr = now, rec, 0, ""
				case ctx.Err() != nil:
					return
				default:
					// A conflict too: the watch brings the Lease as it is.
					if err.Error() != lastErr {
						f.c.log.Warn("kube: cannot write this node's record for its peers; trying again", "lease", LeaseNamespace+"/"+f.node, "err", err)
						lastErr = err.Error()
					}
					retry = min(max(2*retry, time.Second), 30*time.Second)
					notBefore = time.Now().Add(retry)
				}
			}
			wait = max(time.Until(written.Add(leaseRenew)), time.Second)
			if retry > 0 {
				wait = max(time.Until(notBefore), 10*time.Millisecond)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-changes:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}

// ownRecord is what this node says of itself, from its Node in the copy
// (false until the copy holds it).
func (f *Follower) ownRecord(address string) (record, bool) {
	raw, found, _ := f.nodes.Get(f.node)
	if !found {
		return record{}, false
	}
	var n node
	if err := json.Unmarshal(raw, &n); err != nil || n.Metadata.UID == "" {
		return record{}, false
	}
	r := recordOf(&n, address)
	f.mu.Lock()
	r.bundle = f.reporting
	f.mu.Unlock()
	return r, true
}

// ownLease is this node's Lease in the copy (nil when there is none, or
// the copy is not synced: a create then answers a conflict, and the
// watch brings the Lease).
func (f *Follower) ownLease() *lease {
	raw, found, _ := f.leases.Get(f.node)
	if !found {
		return nil
	}
	var l lease
	if json.Unmarshal(raw, &l) != nil {
		return nil
	}
	return &l
}
