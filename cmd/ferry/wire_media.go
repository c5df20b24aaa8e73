package main

import (
	"context"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/media"
	"github.com/ferry-edge/ferry/udev"
)

// udevSource gives the agent udev's block device events in its words.
type udevSource struct{ m *udev.Monitor }

func (s udevSource) Events(ctx context.Context) (<-chan agent.DeviceEvent, error) {
	in, err := s.m.Events(ctx)
	if err != nil {
		return nil, err
	}
	out := make(chan agent.DeviceEvent)
	go func() {
		defer close(out)
		for ev := range in {
			a := agent.DeviceEvent{Action: string(ev.Action), Device: ev.DevPath, FSType: ev.FSType}
			if ev.Gone() {
				a.Action = "remove"
			}
			select {
			case out <- a:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// mediaOpener hands the agent's device event to media as it is: the
// device and its filesystem. A *media.Medium is the agent's Medium.
type mediaOpener struct{ m *media.Media }

func (u mediaOpener) Open(ctx context.Context, ev agent.DeviceEvent) (agent.Medium, error) {
	m, err := u.m.OpenDevice(ctx, ev.Device, ev.FSType)
	if err != nil {
		return nil, err
	}
	return m, nil
}
