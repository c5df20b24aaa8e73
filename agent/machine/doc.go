// Package machine is the node agent's state machine: its states (records
// and phases), the events it takes, the effects it asks for, the gate, the
// approvals and the conditions it reports. Machine.Step is its one
// transition function; it does no I/O but its log lines, and its state
// holds no open file or channel (MediumID and ReplyID name those; the
// agent keeps them). Package agent runs the loop, performs the effects and
// turns what happens into events.
package machine
