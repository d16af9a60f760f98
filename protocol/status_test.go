package protocol

import (
	"fmt"
	"testing"
)

// TestStatusColumns pins every row of the status table: its name and how a
// producer treats it (retry, fault for avoidance, route refresh).
func TestStatusColumns(t *testing.T) {
	type row struct {
		name                    string
		retry, fault, refreshes bool
	}
	want := map[Status]row{
		StatusOK:               {"OK", false, false, false},
		StatusReadOnly:         {"READ_ONLY", true, false, true},
		StatusNotMaster:        {"NOT_MASTER", true, false, true},
		StatusSlaveLagging:     {"SLAVE_LAGGING", true, false, false},
		StatusSlaveSyncTimeout: {"SLAVE_SYNC_TIMEOUT", true, true, false},
		StatusFlushTimeout:     {"FLUSH_TIMEOUT", true, true, false},
		StatusNoRoute:          {"NO_ROUTE", true, false, true},
		StatusMessageTooLarge:  {"MESSAGE_TOO_LARGE", false, false, false},
		StatusInvalid:          {"INVALID", false, false, false},
		StatusStoreError:       {"STORE_ERROR", true, true, false},
		StatusBusy:             {"BUSY", true, true, false},
		StatusNotLeader:        {"NOT_LEADER", true, false, false},
		StatusDuplicate:        {"DUPLICATE", false, false, false},
		StatusUnknownCode:      {"UNKNOWN_CODE", false, false, false},
		StatusUnknownTopic:     {"UNKNOWN_TOPIC", false, false, false},
		StatusTimeout:          {"TIMEOUT", true, true, false},
		StatusConflict:         {"CONFLICT", false, false, false},
		StatusNotFound:         {"NOT_FOUND", false, false, false},
		StatusShuttingDown:     {"SHUTTING_DOWN", true, true, false},
		StatusInternal:         {"INTERNAL", false, true, false},
	}
	for s := Status(0); s < 1<<10; s++ {
		w, known := want[s]
		got := row{s.String(), s.Retriable(), s.Fault(), s.RefreshesRoute()}
		if !known {
			// Unknown statuses (a newer peer's) are never retried, blamed on
			// the group or taken as a stale route.
			if s.Known() || got != (row{got.name, false, false, false}) || got.name != fmt.Sprintf("STATUS(%d)", s) {
				t.Errorf("unknown status %d: %+v, known %v", s, got, s.Known())
			}
			continue
		}
		if !s.Known() || got != w {
			t.Errorf("status %d: got %+v, want %+v", s, got, w)
		}
	}
	if len(want) != len(statusTable) {
		t.Errorf("the table has %d rows, the test %d: pin the new ones", len(statusTable), len(want))
	}
	// The largest status value cannot index past the table.
	if s := Status(1<<16 - 1); s.Known() || s.Retriable() || s.Fault() || s.RefreshesRoute() {
		t.Errorf("status %d is known", s)
	}
	// A fault is never a status the route explains: refreshing the route
	// is the answer to those, not avoiding the group.
	for s := range want {
		if s.Fault() && s.RefreshesRoute() {
			t.Errorf("%v is both a fault and a stale route", s)
		}
	}
}
