package agent

// Phase is where one bundle is on this node.
type Phase string

// Phases, in order; rejected, failed and conflict are terminal reports.
const (
	PhaseIdle         Phase = "idle"      // no bundle (status only)
	PhaseDetected     Phase = "detected"  // seen; verifying and extracting
	PhaseFetching     Phase = "fetching"  // being fetched from peers
	PhaseExtracted    Phase = "extracted" // verified and extracted
	PhaseLoading      Phase = "loading"   // pulling and pinning into CRI-O
	PhaseLoaded       Phase = "loaded"    // every image present and pinned
	PhaseClusterReady Phase = "cluster-ready"
	PhaseCleaned      Phase = "cleaned"
	PhaseRejected     Phase = "rejected"
	PhaseFailed       Phase = "failed"
	PhaseConflict     Phase = "conflict"
)

// Active reports whether a bundle in this phase holds the node: a second,
// different bundle is then a conflict.
func (p Phase) Active() bool {
	switch p {
	case PhaseDetected, PhaseFetching, PhaseExtracted, PhaseLoading, PhaseLoaded, PhaseClusterReady:
		return true
	}
	return false
}

// Loaded reports whether every image of the bundle is present and pinned.
func (p Phase) Loaded() bool { return p == PhaseLoaded || p == PhaseClusterReady }

// Origin is where a bundle came from.
type Origin string

const (
	OriginStick Origin = "stick"
	OriginFile  Origin = "file" // ferry load
	OriginPeer  Origin = "peer"
)
