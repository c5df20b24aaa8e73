package machine

import "strings"

// Annotation keys on the node's Node object (docs/design.md, "The UpgradeBundle").
const (
	AnnotationPhase    = "ferry.io/phase"
	AnnotationBundle   = "ferry.io/bundle"
	AnnotationDigest   = "ferry.io/digest"
	AnnotationProgress = "ferry.io/progress"
	AnnotationReason   = "ferry.io/reason"
)

// annotations are the Node annotations that tell s; an empty value
// removes its key.
func Annotations(s Status) map[string]string {
	out := map[string]string{
		AnnotationPhase: s.Phase, AnnotationBundle: "", AnnotationDigest: string(s.Digest),
		AnnotationProgress: "", AnnotationReason: SanitizeReason(strings.TrimPrefix(s.Message+HeldBack(s.HoldingBack), " — ")),
	}
	if s.Bundle != "" {
		out[AnnotationBundle] = SanitizeReason(strings.TrimSuffix(strings.TrimPrefix(s.Bundle, "upgrade-"), ".tar"))
	}
	out[AnnotationProgress] = progressText(s)
	if out[AnnotationReason] == "" && !s.Healthy {
		out[AnnotationReason] = SanitizeReason(s.Error)
	}
	return out
}

// progressText is a node's progress in words, while it is moving: bytes
// read or fetched, images loaded, or the version operator's line.
func progressText(s Status) string {
	switch p := s.Progress; {
	case s.Phase == string(PhaseUpgrading):
		return s.ClusterMessage
	case p == nil || p.Total <= 0:
		return ""
	case s.Phase != string(PhaseDetected) && s.Phase != string(PhaseFetching) && s.Phase != string(PhaseLoading):
		return ""
	case p.Unit == "images":
		return itoa(p.Done) + "/" + itoa(p.Total) + " images"
	}
	return ofTotal(s.Progress.Done, s.Progress.Total)
}
