// Package machine is the node agent's state machine: its states (records
// and phases), the events it takes, the effects it asks for, the gate, the
// approvals and the conditions it reports. Machine.Step is its one
// transition function; it does no I/O but its log lines, and its state
// holds no open file or channel (MediumID and ReplyID name those; the
// agent keeps them). Package agent runs the loop, performs the effects and
// turns what happens into events. It links the standard library's
// smallest packages and ferry's leaves of them, nothing that does I/O or
// talks to a network, and no fmt (TestImports; docs/design.md, "The
// rooms").
package machine
