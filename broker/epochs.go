package broker

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ferrymq/ferrymq/routing"
)

// localEpochs is what a broker keeps on its disk (the file "epoch" in its
// data directory) of the epochs whose records its log holds, oldest first:
// each epoch's number, master, and the log offset where it began. The last
// one is the broker's local epoch.
//
// It is written, durably, before the broker acts in an epoch: a master
// writes its own epoch, starting at its log end, before it takes a write;
// a slave writes the registry's history up to the epoch it joins after it
// cut its log and before it copies a byte. So the file never names fewer
// epochs than the log holds records of, and a master's own start, which
// the registry fixes from its report (api.Heartbeat.EpochStart), survives
// every restart unchanged: a restart reports the start on disk, never the
// log's end at the restart.
//
// Start is -1 where the broker does not know it: a file written by an
// earlier version held only the local epoch's number.
type localEpochs []routing.EpochRecord

// maxLocalEpochs bounds the file: older epochs matter only to a broker
// whose log left the group's before them, and the registry keeps fewer.
const maxLocalEpochs = 64

const epochsHeader = "ferrymq epochs 1"

// epoch returns the local epoch: the last one whose records the log holds
// (0: none).
func (h localEpochs) epoch() uint32 {
	if len(h) == 0 {
		return 0
	}
	return h[len(h)-1].Epoch
}

// record returns the record of epoch e.
func (h localEpochs) record(e uint32) (routing.EpochRecord, bool) {
	for _, r := range h {
		if r.Epoch == e {
			return r, true
		}
	}
	return routing.EpochRecord{}, false
}

// joined returns the history of a broker that joins epoch e of g: the
// registry's records up to e, with this broker's own start where it knows
// one the registry has not fixed (a master's takeover).
func (h localEpochs) joined(g routing.Group, e uint32, own *routing.EpochRecord) localEpochs {
	var out localEpochs
	for _, r := range g.History {
		if r.Epoch > e {
			break
		}
		if own != nil && r.Epoch == own.Epoch {
			continue
		}
		out = append(out, r)
	}
	if own != nil {
		out = append(out, *own)
	}
	if n := len(out) - maxLocalEpochs; n > 0 {
		out = out[n:]
	}
	return out
}

// learn takes the starts the registry fixed since the file was written, for
// epochs the file holds unfixed; it reports whether anything changed.
func (h localEpochs) learn(g routing.Group) (localEpochs, bool) {
	var out localEpochs
	for i, r := range h {
		reg, ok := g.Record(r.Epoch)
		if !ok || !reg.Fixed || r.Fixed && r.Start >= 0 {
			continue
		}
		if out == nil {
			out = append(localEpochs(nil), h...)
		}
		out[i].Start, out[i].Fixed = reg.Start, true
	}
	if out == nil {
		return h, false
	}
	return out, true
}

// conflict returns, if the registry's history disagrees with this log's on
// where an epoch began (both fixed), a sentence saying so; "" otherwise. A
// fixed start never moves, so a disagreement means the history was
// rewritten (metaservers or brokers from before starts were fixed moved
// them at restarts), and the log cannot be matched to the group's by it.
func (h localEpochs) conflict(g routing.Group) string {
	for _, r := range h {
		if !r.Fixed || r.Start < 0 {
			continue
		}
		if reg, ok := g.Record(r.Epoch); ok && reg.Fixed && reg.Start != r.Start {
			return fmt.Sprintf("the registry says epoch %d of group %s began at log offset %d, this broker's log has it at %d: the group's epoch history was rewritten",
				r.Epoch, g.Name, reg.Start, r.Start)
		}
	}
	return ""
}

// loadEpochs reads the local epochs; a missing file is none. A file of one
// number (an earlier version's) is that epoch with an unknown start.
func loadEpochs(dir string) (localEpochs, error) {
	path := filepath.Join(dir, epochFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("broker: read the local epochs: %w", err)
	}
	bad := func(why string) error { return fmt.Errorf("broker: local epochs file %s: %s", path, why) }
	text := strings.TrimSpace(string(b))
	if !strings.HasPrefix(text, epochsHeader) {
		e, err := strconv.ParseUint(text, 10, 32)
		if err != nil {
			return nil, bad(err.Error())
		}
		if e == 0 {
			return nil, nil
		}
		return localEpochs{{Epoch: uint32(e), Start: -1}}, nil
	}
	var h localEpochs
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Scan() // the header
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 4) // the master's id is the rest of the line
		if len(f) != 4 {
			return nil, bad(fmt.Sprintf("line %q: want epoch, start, fixed and master", sc.Text()))
		}
		e, err1 := strconv.ParseUint(f[0], 10, 32)
		start, err2 := strconv.ParseInt(f[1], 10, 64)
		fixed, err3 := strconv.ParseBool(f[2])
		if err := errors.Join(err1, err2, err3); err != nil || start < -1 || e == 0 || len(h) > 0 && uint32(e) <= h.epoch() {
			return nil, bad(fmt.Sprintf("line %q: %v", sc.Text(), err))
		}
		h = append(h, routing.EpochRecord{Epoch: uint32(e), Start: start, Fixed: fixed, Master: f[3]})
	}
	return h, nil
}

// save writes the local epochs durably: a temporary file, synced, renamed,
// the directory synced.
func (h localEpochs) save(dir string) error {
	var buf bytes.Buffer
	buf.WriteString(epochsHeader + "\n")
	for _, r := range h {
		fmt.Fprintf(&buf, "%d %d %t %s\n", r.Epoch, r.Start, r.Fixed, strings.ReplaceAll(r.Master, "\n", " "))
	}
	path := filepath.Join(dir, epochFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, fileMode)
	if err != nil {
		return fmt.Errorf("broker: write the local epochs: %w", err)
	}
	_, err = f.Write(buf.Bytes())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("broker: write the local epochs: %w", err)
	}
	return nil
}

// The modes of the files and directories the broker writes itself (the
// epoch file, a failover tail's marker), as the commit log's (storage/vfs's
// FileMode and DirMode): no other local user reads a broker's data.
const (
	fileMode = 0o600
	dirMode  = 0o700
)

// syncDir makes dir's entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}

// epochState is what the roles last acted on, for the parts that read
// beside them: the local epoch (the last one whose records the log holds)
// and the registry's view the roles last reconciled. Only the roles write
// it; PULLs check a reader's epoch against it and the tail handover finds
// the master in it.
type epochState struct {
	local atomic.Uint32
	view  atomic.Pointer[groupView] // nil before the roles' first view
}

// epochStart returns the log offset from which a reader of epoch must not
// trust what it read: the lowest start of the epochs after it, by the
// registry's last word, and whether there is one; known is false while the
// broker has no word from the registry yet and its own log is of a later
// epoch (it cannot tell where that epoch began).
func (s *epochState) epochStart(epoch uint32) (start int64, ok, known bool) {
	g := s.view.Load()
	if g == nil {
		return 0, false, epoch >= s.local.Load()
	}
	if epoch >= g.Epoch {
		return 0, false, true
	}
	for _, e := range g.History {
		if e.Epoch > epoch && (!ok || e.Start < start) {
			start, ok = e.Start, true
		}
	}
	return start, ok, true // older than the history: not checked (DESIGN.md, known gaps)
}

// LocalEpochs returns the epochs a broker's data directory records (the
// file "epoch"), oldest first: what its log holds records of, and where each
// began as the broker knows it (Start -1: unknown).
func LocalEpochs(dir string) ([]routing.EpochRecord, error) { return loadEpochs(dir) }
