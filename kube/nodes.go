package kube

import (
	"context"
	"net/url"
	"time"
)

// Annotate sets annotations and labels on the Node named node with one
// merge patch; an empty value removes its key.
func (c *Client) Annotate(ctx context.Context, node string, annotations, labels map[string]string) error {
	nullable := func(m map[string]string) map[string]any {
		out := map[string]any{}
		for k, v := range m {
			if v == "" {
				out[k] = nil // null removes the key in a merge patch
			} else {
				out[k] = v
			}
		}
		return out
	}
	md := map[string]any{"annotations": nullable(annotations)}
	if len(labels) > 0 {
		md["labels"] = nullable(labels)
	}
	patch := map[string]any{"metadata": md}
	return c.do(ctx, "PATCH", "/api/v1/nodes/"+url.PathEscape(node), mergePatch, patch, nil)
}

// NodeAnnotations returns the annotations of the Node named node (a
// kubelet's credential reads no other Node).
func (c *Client) NodeAnnotations(ctx context.Context, name string) (map[string]string, error) {
	var n node
	if err := c.do(ctx, "GET", "/api/v1/nodes/"+url.PathEscape(name), "", nil, &n); err != nil {
		return nil, err
	}
	return n.Metadata.Annotations, nil
}

// internalIP is n's first InternalIP ("" when it has none).
func internalIP(n *node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == "InternalIP" {
			return a.Address
		}
	}
	return ""
}

// node is what ferry reads of a Node besides the MCO's state.
type node struct {
	Metadata struct {
		Name              string            `json:"name"`
		UID               string            `json:"uid"`
		Annotations       map[string]string `json:"annotations"`
		CreationTimestamp time.Time         `json:"creationTimestamp"`
	} `json:"metadata"`
	Status struct {
		Addresses []struct {
			Type    string `json:"type"`
			Address string `json:"address"`
		} `json:"addresses"`
		Conditions []struct {
			Type               string    `json:"type"`
			Status             string    `json:"status"`
			LastTransitionTime time.Time `json:"lastTransitionTime"`
		} `json:"conditions"`
	} `json:"status"`
}
