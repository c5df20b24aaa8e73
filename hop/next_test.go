package hop

import "testing"

func TestNext_HopByHopNeverSkipping(t *testing.T) {
	vs := []string{"4.17.20", "4.18.10"}
	for _, tc := range []struct {
		name          string
		hops          []HopState
		pause, paused bool
		want          Action
	}{
		{"pause first", []HopState{NotAsked, NotAsked}, true, false, Action{Do: PausePools}},
		{"then the first hop", []HopState{NotAsked, NotAsked}, true, true, Action{Do: AskHop, Hop: 0}},
		{"not paused: the first hop at once", []HopState{NotAsked, NotAsked}, false, false, Action{Do: AskHop, Hop: 0}},
		{"wait for the first", []HopState{Asked, NotAsked}, true, true, Action{Do: WaitHop, Hop: 0}},
		{"first Completed: the second", []HopState{Completed, NotAsked}, true, true, Action{Do: AskHop, Hop: 1}},
		{"never skip: a later hop asked while the first is not Completed", []HopState{Asked, Asked}, true, true, Action{Do: WaitHop, Hop: 0}},
		{"never send the cluster back: a later hop asked by someone else stops the path", []HopState{NotAsked, Asked}, false, false, Action{Do: Failed, Hop: 0}},
		{"wait for the second", []HopState{Completed, Asked}, true, true, Action{Do: WaitHop, Hop: 1}},
		{"all Completed: unpause", []HopState{Completed, Completed}, true, true, Action{Do: UnpausePools, Hop: 1}},
		{"unpaused: done", []HopState{Completed, Completed}, true, false, Action{Do: Done, Hop: 1}},
		{"not paused: done", []HopState{Completed, Completed}, false, false, Action{Do: Done, Hop: 1}},
		{"a refused hop stops the path", []HopState{Completed, Refused}, true, true, Action{Do: Failed, Hop: 1}},
		{"a refused first hop stops it before the second", []HopState{Refused, NotAsked}, true, true, Action{Do: Failed, Hop: 0}},
	} {
		s := State{From: "4.16.3", Versions: vs, Hops: tc.hops, Pause: tc.pause, Paused: tc.paused}
		if got := Next(s); got != tc.want {
			t.Errorf("%s: Next = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestMinorPath(t *testing.T) {
	for _, tc := range []struct {
		from string
		vs   []string
		want bool
	}{
		{"4.16.3", []string{"4.17.20", "4.18.10"}, true},
		{"4.22.3", []string{"4.22.9", "5.0.0"}, true},
		{"4.16.3", []string{"4.16.9", "4.16.12"}, false},
		{"4.16.3", []string{"4.17.20"}, false},
	} {
		if got := MinorPath(tc.from, tc.vs); got != tc.want {
			t.Errorf("MinorPath(%s, %v) = %v, want %v", tc.from, tc.vs, got, tc.want)
		}
	}
}

func TestDescribe_NamesTheHop(t *testing.T) {
	s := State{From: "4.16.3", Versions: []string{"4.17.20", "4.18.10"}}
	if got := s.Describe(Action{Do: Failed, Hop: 1}); got != "hop 2 of 2 (4.18.10) failed: the path stops at 4.17.20" {
		t.Errorf("Describe = %q", got)
	}
	if got := s.Describe(Action{Do: AskHop, Hop: 0}); got != "hop 1 of 2: asking the cluster for 4.17.20" {
		t.Errorf("Describe = %q", got)
	}
}
