package protocol

import (
	"fmt"
	"testing"
)

// TestStatusColumns pins every row of the status table: its name and how a
// producer treats it (retry, fault for avoidance, route refresh, may have
// been stored).
func TestStatusColumns(t *testing.T) {
	type row struct {
		name                           string
		retry, fault, refreshes, maybe bool
	}
	want := map[Status]row{
		StatusOK:                 {"OK", false, false, false, false},
		StatusReadOnly:           {"READ_ONLY", true, false, true, false},
		StatusNotMaster:          {"NOT_MASTER", true, false, true, false},
		StatusSlaveLagging:       {"SLAVE_LAGGING", true, false, false, false},
		StatusSlaveSyncTimeout:   {"SLAVE_SYNC_TIMEOUT", true, true, false, true},
		StatusFlushTimeout:       {"FLUSH_TIMEOUT", true, true, false, true},
		StatusNoRoute:            {"NO_ROUTE", true, false, true, false},
		StatusMessageTooLarge:    {"MESSAGE_TOO_LARGE", false, false, false, false},
		StatusInvalid:            {"INVALID", false, false, false, false},
		StatusStoreError:         {"STORE_ERROR", true, true, false, true},
		StatusBusy:               {"BUSY", true, true, false, false},
		StatusNotLeader:          {"NOT_LEADER", true, false, false, false},
		StatusDuplicate:          {"DUPLICATE", false, false, false, false},
		StatusUnknownCode:        {"UNKNOWN_CODE", false, false, false, false},
		StatusUnknownTopic:       {"UNKNOWN_TOPIC", false, false, false, false},
		StatusTimeout:            {"TIMEOUT", true, true, false, true},
		StatusConflict:           {"CONFLICT", false, false, false, false},
		StatusNotFound:           {"NOT_FOUND", false, false, false, false},
		StatusShuttingDown:       {"SHUTTING_DOWN", true, true, false, false},
		StatusInternal:           {"INTERNAL", false, true, false, true},
		StatusOutOfOrderSequence: {"OUT_OF_ORDER_SEQUENCE", true, false, false, false},
		StatusProducerFenced:     {"PRODUCER_FENCED", false, false, false, false},
		StatusLeaseLost:          {"LEASE_LOST", true, false, true, true},
		StatusNotAuthorized:      {"NOT_AUTHORIZED", false, false, false, false},
		StatusStaleGeneration:    {"STALE_GENERATION", false, false, false, false},
		StatusGroupActive:        {"GROUP_ACTIVE", false, false, false, false},
	}
	for s := Status(0); s < 1<<10; s++ {
		w, known := want[s]
		got := row{s.String(), s.Retriable(), s.Fault(), s.RefreshesRoute(), s.MaybeStored()}
		if !known {
			// Unknown statuses (a newer peer's) are never retried, blamed on
			// the group or taken as a stale route.
			if s.Known() || got != (row{got.name, false, false, false, false}) || got.name != fmt.Sprintf("STATUS(%d)", s) {
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
