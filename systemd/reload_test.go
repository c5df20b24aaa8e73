package systemd

import (
	"context"
	"errors"
	"testing"
)

type fakeUnitConn struct {
	result  string // sent on the channel; "" sends nothing
	callErr error
	closed  bool
	unit    string
	mode    string
}

func (f *fakeUnitConn) ReloadUnitContext(ctx context.Context, name, mode string, ch chan<- string) (int, error) {
	f.unit, f.mode = name, mode
	if f.callErr != nil {
		return 0, f.callErr
	}
	if f.result != "" {
		ch <- f.result // would block forever on an unbuffered channel nobody reads
	}
	return 7, nil
}

func (f *fakeUnitConn) Close() { f.closed = true }

func TestUnitReloader_WaitsForJobResult(t *testing.T) {
	for name, tc := range map[string]struct {
		conn    *fakeUnitConn
		dialErr error
		cancel  bool
		wantErr error
		wantOK  bool
	}{
		"done is success":           {conn: &fakeUnitConn{result: "done"}, wantOK: true},
		"failed job is ErrReload":   {conn: &fakeUnitConn{result: "failed"}, wantErr: ErrReload},
		"canceled job is ErrReload": {conn: &fakeUnitConn{result: "canceled"}, wantErr: ErrReload},
		"call error is ErrReload":   {conn: &fakeUnitConn{callErr: errors.New("Unit crio.service not loaded")}, wantErr: ErrReload},
		"no systemd":                {dialErr: errors.New("dial unix /run/systemd/private: no such file")},
		"context ends first":        {conn: &fakeUnitConn{}, cancel: true, wantErr: context.Canceled},
	} {
		t.Run(name, func(t *testing.T) {
			r := &UnitReloader{Unit: "crio.service", dial: func(context.Context) (unitConn, error) {
				if tc.dialErr != nil {
					return nil, tc.dialErr
				}
				return tc.conn, nil
			}}
			ctx, cancel := context.WithCancel(t.Context())
			if tc.cancel {
				cancel()
			}
			defer cancel()
			err := r.Reload(ctx)
			switch {
			case tc.wantOK && err != nil:
				t.Fatalf("got %v, want nil", err)
			case !tc.wantOK && err == nil:
				t.Fatal("got nil, want an error")
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				t.Log(err)
			}
			if tc.conn != nil {
				if !tc.conn.closed {
					t.Error("connection not closed")
				}
				if tc.conn.unit != "crio.service" || tc.conn.mode != "replace" {
					t.Errorf("reloaded %q mode %q", tc.conn.unit, tc.conn.mode)
				}
			}
		})
	}
}
