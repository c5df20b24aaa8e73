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

// NodeAnnotations returns the annotations of every Node, by node name.
func (c *Client) NodeAnnotations(ctx context.Context) (map[string]map[string]string, error) {
	nodes, err := c.listNodes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]string{}
	for _, n := range nodes {
		out[n.Metadata.Name] = n.Metadata.Annotations
	}
	return out, nil
}

// NodeAddresses maps every Node's name to its InternalIP ("" when it has
// none).
func (c *Client) NodeAddresses(ctx context.Context) (map[string]string, error) {
	nodes, err := c.listNodes(ctx)
	return addressesOf(nodes), err
}

func addressesOf(nodes []node) map[string]string {
	out := map[string]string{}
	for _, n := range nodes {
		out[n.Metadata.Name] = ""
		for _, a := range n.Status.Addresses {
			if a.Type == "InternalIP" {
				out[n.Metadata.Name] = a.Address
				break
			}
		}
	}
	return out
}

// node is what ferry reads of a Node besides the MCO's state.
type node struct {
	Metadata struct {
		Name              string            `json:"name"`
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

func (c *Client) listNodes(ctx context.Context) ([]node, error) {
	var list struct {
		Items []node `json:"items"`
	}
	if err := c.do(ctx, "GET", "/api/v1/nodes", "", nil, &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}
