package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// UpgradeBundleNode is one node's view of the UpgradeBundles it knows, as
// the machine config operator's MachineConfigNode is of its
// MachineConfigs: one per Node, named after it and owned by it (the
// garbage collector deletes it with the Node), written by that node alone
// (its own field manager, ferry-<node>). A node's write changes only its
// own object, so a node's progress costs the other nodes nothing: only
// the node that writes the UpgradeBundles' summaries reads them all.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ubn
// +kubebuilder:printcolumn:name="Bundle",type=string,JSONPath=`.status.bundles[0].name`,description="The bundle the node reports on now."
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.bundles[0].phase`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.bundles[0].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Digest",type=string,JSONPath=`.status.bundles[0].digest`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.bundles[0].message`,priority=1
type UpgradeBundleNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Status UpgradeBundleNodeStatus `json:"status,omitempty"`
}

// UpgradeBundleNodeList is a list of UpgradeBundleNodes.
//
// +kubebuilder:object:root=true
type UpgradeBundleNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []UpgradeBundleNode `json:"items"`
}

// UpgradeBundleNodeStatus is what the node says of each UpgradeBundle it
// knows.
type UpgradeBundleNodeStatus struct {
	// bundles are the node's entries, one per UpgradeBundle, the one it
	// reports on now first; an entry goes when its UpgradeBundle does.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Bundles []BundleNodeStatus `json:"bundles,omitempty"`
}

// BundleNodeStatus is the node's entry for one UpgradeBundle.
type BundleNodeStatus struct {
	// name is the UpgradeBundle's name (<version>-<arch>).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	NodeStatus `json:",inline"`
}
