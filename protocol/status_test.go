package protocol

import (
	"errors"
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
		StatusLogDiverged:        {"LOG_DIVERGED", false, false, false, false},
		StatusMemberFenced:       {"MEMBER_FENCED", false, false, false, false},
		// Refused before it was stored: retry (later, when the set grew);
		// after the append: it may be stored, so the retry relies on the
		// producer's dedupe.
		StatusNotEnoughReplicas:            {"NOT_ENOUGH_REPLICAS", true, false, false, false},
		StatusNotEnoughReplicasAfterAppend: {"NOT_ENOUGH_REPLICAS_AFTER_APPEND", true, true, false, true},
		StatusDelayQuota:                   {"DELAY_QUOTA", false, false, false, false},
		StatusTxnFenced:                    {"TXN_FENCED", false, false, false, false},
		StatusTxnLimit:                     {"TXN_LIMIT", false, false, false, false},
		StatusTxnIncomplete:                {"TXN_INCOMPLETE", false, false, false, false},
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

// TestErrorNamesItsStatusOnce: an error whose detail already carries its
// status's name (an answer from a peer that put it in its text, or a
// message built from another error of the same status) names it once, and
// still matches its sentinel.
func TestErrorNamesItsStatusOnce(t *testing.T) {
	for _, msg := range []string{
		`topic "x" does not exist`,
		`UNKNOWN_TOPIC: topic "x" does not exist`,
		`ferrymq: UNKNOWN_TOPIC: topic "x" does not exist`,
		`ferrymq: UNKNOWN_TOPIC: UNKNOWN_TOPIC: ferrymq: UNKNOWN_TOPIC: topic "x" does not exist`,
	} {
		for _, err := range []error{ErrorForStatus(StatusUnknownTopic, msg), &Error{Status: StatusUnknownTopic, Message: msg}} {
			if got, want := err.Error(), `ferrymq: UNKNOWN_TOPIC: topic "x" does not exist`; got != want {
				t.Errorf("%q: %q, want %q", msg, got, want)
			}
			if !errors.Is(err, ErrUnknownTopic) {
				t.Errorf("%q: does not match ErrUnknownTopic", msg)
			}
		}
	}
	// Only the status's own name is cut: another status's, or a word that
	// merely starts like it, stays.
	for _, c := range []struct {
		s   Status
		msg string
	}{
		{StatusInvalid, "ferrymq: NOT_FOUND: group x"},
		{StatusNotFound, "NOT_FOUNDATION"},
		{StatusNotFound, "ferrymq: something else"},
	} {
		if got, want := ErrorForStatus(c.s, c.msg).Error(), "ferrymq: "+c.s.String()+": "+c.msg; got != want {
			t.Errorf("%v %q: %q, want %q", c.s, c.msg, got, want)
		}
	}
	if got := ErrorForStatus(StatusBusy, "BUSY").Error(); got != "ferrymq: BUSY" {
		t.Errorf("a message that is only the name: %q", got)
	}
}
