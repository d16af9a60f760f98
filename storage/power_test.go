package storage

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/storage/vfs"
)

// powerRec is a record the power-loss test appended, in the log's order.
type powerRec struct {
	k       queueKey
	qo      int64
	payload []byte
	lo, end int64
}

// TestPowerLossLosesNoAcknowledgedRecord runs a log on a vfs.MemFS, the
// data directory made by the log itself or beforehand, and takes the
// machine down at random points: a power loss (what no Sync or SyncDir made
// durable is lost, or a random part of it survives, page by page and
// change by change) or a killed process (the page cache survives), in the
// middle of an Open, an append, a segment roll, an index chunk write, a
// retention deletion or a truncation, up to four times. Between downs it
// appends batches to three queues (FlushSync, or FlushAsync with some
// appends asking for their flush and some Flush calls), deletes old
// segments and truncates the log with a side file.
//
// After each recovery: every append acknowledged as synced (every append
// under FlushSync) is there with its queue offset and bytes; what was lost
// is a tail of the log, only records appended after the last acknowledged
// sync, or of the append the down failed; no record is served that was
// not appended, or at another queue offset; every queue's next offset is
// past its last surviving record (so no queue offset of an acknowledged
// synced record is handed out again) and not past the last one it handed
// out; and every side file a completed Truncate returned is there, byte
// for byte.
func TestPowerLossLosesNoAcknowledgedRecord(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		mem := vfs.NewMemFS()
		const dir = "/srv/ferrymq/data"
		if rapid.Bool().Draw(rt, "data directory made beforehand") {
			err := mem.MkdirAll(dir)
			for _, d := range []string{"/", "/srv", "/srv/ferrymq"} {
				err = errors.Join(err, mem.SyncDir(d))
			}
			if err != nil {
				rt.Fatal(err)
			}
		}
		mode := rapid.SampledFrom([]FlushMode{FlushSync, FlushAsync}).Draw(rt, "flush mode")
		cfg := Config{Dir: dir, Flush: mode, FlushInterval: time.Hour,
			SegmentSize:     rapid.SampledFrom([]int64{300, 1024, 1 << 20}).Draw(rt, "segment size"),
			IndexChunkBytes: rapid.SampledFrom([]int64{1, 200, 700, 0}).Draw(rt, "index chunk bytes"),
			Pretouch:        rapid.SampledFrom([]int64{-1, 64, 4096}).Draw(rt, "pretouch")}

		p := &powerRun{rt: rt, mem: mem, efs: vfs.NewErrorFS(mem), cfg: cfg, sides: map[string][]byte{}, pendingCut: -1,
			nexts: map[queueKey]int64{}, ever: map[queueKey]int64{}}
		for cycle, cycles := 0, rapid.IntRange(1, 4).Draw(rt, "downs"); cycle < cycles; cycle++ {
			// The first Open (which may create the data directory) can
			// always be hit; a later one, recovering, sometimes.
			if cycle == 0 || rapid.Bool().Draw(rt, "down during recovery") {
				p.arm()
			}
			l, err := p.open()
			p.disarm() // the checks run with the machine up
			if err != nil && !p.dead() {
				p.fatalf("open: %v", err)
			}
			if p.dead() {
				if err == nil {
					crash(l)
				}
				p.down()
				continue
			}
			p.check(l)
			p.arm()
			p.work(l, cycle)
			crash(l)
			p.down()
		}
		l, err := p.open()
		if err != nil {
			p.fatalf("open after the last down: %v", err)
		}
		p.check(l)
		if err := l.Close(); err != nil {
			rt.Fatal(err)
		}
	})
}

// powerRun is one case of TestPowerLossLosesNoAcknowledgedRecord: the file
// system, how the machine goes down next, and the model of the log.
type powerRun struct {
	rt  *rapid.T
	mem *vfs.MemFS
	efs *vfs.ErrorFS // over mem: kills the process
	cfg Config

	kill  *vfs.Rule          // the armed kill, if any
	power vfs.CrashOptions   // what the next power loss keeps
	recs  []powerRec         // what the log holds, in log order
	nexts map[queueKey]int64 // the queue offset each queue's next append gets
	// ever bounds the next offset a queue may come back with: past every
	// offset handed out since the last truncation (a down may lose the
	// records of some, and the log may or may not give them out again).
	ever   map[queueKey]int64
	synced int64             // every record ending at or before it was acknowledged as synced
	sides  map[string][]byte // the side files of completed truncations
	// uncertain is the batch whose append the down failed: it may have
	// been written, in part (a prefix) or whole, and survive.
	uncertain []Entry
	// pendingCut is the offset of a truncation that the down interrupted
	// (-1: none): the log comes back cut there or whole.
	pendingCut int64
	epoch      uint32
	history    []string // what happened, for a failure's report
}

func (p *powerRun) note(format string, args ...any) {
	p.history = append(p.history, fmt.Sprintf(format, args...))
}

func (p *powerRun) fatalf(format string, args ...any) {
	p.rt.Fatalf(format+"\nhistory:\n  %s", append(args, strings.Join(p.history, "\n  "))...)
}

func (p *powerRun) open() (*Log, error) {
	cfg := p.cfg
	cfg.FS = p.efs
	return Open(cfg)
}

// arm chooses how the machine goes down: at the end of the work, or at a
// random call from now, a power loss or a kill.
func (p *powerRun) arm() {
	rt := p.rt
	p.power = vfs.CrashOptions{}
	if rapid.Bool().Draw(rt, "torn") {
		p.power.Rand = rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 0))
		p.power.PageSize = rapid.SampledFrom([]int{64, 4096}).Draw(rt, "page size")
	}
	switch rapid.SampledFrom([]string{"power loss after the work", "power loss at a call", "kill at a call"}).Draw(rt, "down") {
	case "power loss at a call":
		n := rapid.Int64Range(1, 150).Draw(rt, "mutating calls before the power loss")
		p.mem.CutPowerAt(n, p.power)
		p.note("armed: a power loss at mutating call %d from now (torn %v)", n, p.power.Rand != nil)
	case "kill at a call":
		n := rapid.IntRange(0, 300).Draw(rt, "calls before the kill")
		p.kill = vfs.Fail(vfs.OpAll).After(n)
		p.efs.Inject(p.kill)
		p.note("armed: a kill after %d calls", n)
	default:
		p.note("armed: a power loss after the work (torn %v)", p.power.Rand != nil)
	}
}

// disarm cancels the down armed, if it has not happened.
func (p *powerRun) disarm() {
	p.mem.CancelPowerCut()
	if p.kill != nil {
		p.efs.Drop(p.kill)
		if p.kill.Fired() == 0 {
			p.kill = nil
		}
	}
}

// dead says whether the machine went down (an error is then expected).
func (p *powerRun) dead() bool {
	return p.mem.PowerCut() != nil || p.kill != nil && p.kill.Fired() > 0
}

// down takes the machine down: a killed process leaves its files as they
// are; a power loss (now, or the one armed) leaves what it keeps.
func (p *powerRun) down() {
	p.note("down: killed %v, power cut during the work %v", p.kill != nil, p.mem.PowerCut() != nil)
	if p.kill != nil {
		p.efs.DropAll()
		p.kill = nil
		return
	}
	p.mem = p.mem.CutPower(p.power)
	p.efs = vfs.NewErrorFS(p.mem)
}

// work appends, flushes, deletes and truncates until the machine goes down
// or the drawn number of steps is done.
func (p *powerRun) work(l *Log, cycle int) {
	rt := p.rt
	fail := func(what string, err error) bool {
		if err == nil {
			return false
		}
		if !p.dead() {
			p.fatalf("%s: %v", what, err)
		}
		p.note("%s failed: %v", what, err)
		return true
	}
	for i, n := 0, rapid.IntRange(1, 40).Draw(rt, "steps"); i < n; i++ {
		switch op := rapid.IntRange(0, 9).Draw(rt, "step"); {
		case op == 0:
			end := l.EndOffset()
			if fail("flush", l.Flush()) {
				return
			}
			p.synced = max(p.synced, end)
			p.note("flushed to %d", end)
		case op == 1:
			before := rapid.Int64Range(0, l.EndOffset()).Draw(rt, "delete before")
			start, err := l.DeleteBefore(before)
			if fail("delete", err) {
				return
			}
			p.note("deleted before %d: start %d", before, start)
		case op == 2:
			start := l.StartOffset()
			i := slices.IndexFunc(p.recs, func(r powerRec) bool { return r.lo >= start })
			if i < 0 {
				continue
			}
			at := p.recs[rapid.IntRange(i, len(p.recs)-1).Draw(rt, "truncate at")].lo
			want, err := p.raw(l, at)
			if fail("read the records to cut", err) {
				return
			}
			p.epoch++
			side := filepath.Join(p.cfg.Dir, "truncated", SideFileName(at, p.epoch))
			p.pendingCut = at
			p.note("truncating at %d", at)
			if _, err := l.Truncate(at, side); fail("truncate", err) {
				return
			}
			p.pendingCut = -1
			p.note("truncated at %d to %s", at, side)
			p.cut(at)
			p.synced = at // step 1 of a truncation syncs what it keeps
			p.sides[side] = want
		default:
			var batch []Entry
			for j, m := 0, rapid.IntRange(1, 4).Draw(rt, "batch"); j < m; j++ {
				q := uint32(rapid.IntRange(0, 2).Draw(rt, "queue"))
				tag := fmt.Sprintf("c%d-s%d-e%d-q%d;", cycle, i, j, q)
				size := rapid.IntRange(0, 200).Draw(rt, "size")
				batch = append(batch, Entry{Topic: "power", Queue: q, Payload: bytes.Repeat([]byte(tag), size/len(tag)+1)})
			}
			flush := p.cfg.Flush == FlushSync || rapid.Bool().Draw(rt, "flush")
			pos, err := l.Append(batch, flush)
			if fail("append", err) {
				p.uncertain = batch
				p.note("the failed append had %d entries", len(batch))
				return
			}
			for j, e := range batch {
				k := queueKey{e.Topic, e.Queue}
				if want := p.nexts[k]; pos[j].QueueOffset != want {
					p.fatalf("append to %v got queue offset %d, want %d", k, pos[j].QueueOffset, want)
				}
				p.add(powerRec{k: k, qo: pos[j].QueueOffset, payload: e.Payload, lo: pos[j].LogOffset, end: pos[j].End})
			}
			if flush {
				p.synced = max(p.synced, pos[len(pos)-1].End)
			}
			p.note("appended %d entries at [%d, %d) flush %v", len(batch), pos[0].LogOffset, pos[len(pos)-1].End, flush)
		}
	}
}

func (p *powerRun) add(r powerRec) {
	p.recs = append(p.recs, r)
	p.nexts[r.k] = r.qo + 1
	p.ever[r.k] = max(p.ever[r.k], r.qo+1)
}

// drop removes the model's records for which gone is true (a suffix of
// the log) and returns, per queue, the offset of its first record dropped.
func (p *powerRun) drop(gone func(powerRec) bool) map[queueKey]int64 {
	firsts := map[queueKey]int64{}
	for _, r := range p.recs {
		if _, seen := firsts[r.k]; gone(r) && !seen {
			firsts[r.k] = r.qo
		}
	}
	p.recs = slices.DeleteFunc(p.recs, gone)
	return firsts
}

// raw returns the log's bytes from at to its end.
func (p *powerRun) raw(l *Log, at int64) ([]byte, error) {
	var b []byte
	for off := at; off < l.EndOffset(); {
		chunk, err := l.ReadRaw(off, 1<<20)
		if err != nil {
			return nil, err
		}
		b = append(b, chunk...)
		off += int64(len(chunk))
	}
	return b, nil
}

// cut drops the model's records at or past off, as a truncation does: the
// queues take their offsets up again from the first record cut.
func (p *powerRun) cut(off int64) {
	for k, qo := range p.drop(func(r powerRec) bool { return r.lo >= off }) {
		p.nexts[k], p.ever[k] = qo, qo
	}
	p.synced = min(p.synced, off)
}

// check compares the recovered log with the model, then makes the model
// what the log now holds (recovery synced it).
func (p *powerRun) check(l *Log) {
	end, start := l.EndOffset(), l.StartOffset()
	p.note("recovered [%d, %d)", start, end)
	if p.pendingCut >= 0 {
		if end <= p.pendingCut { // cut, or what was past the cut was never synced
			p.cut(p.pendingCut)
		}
		p.pendingCut = -1
	}
	if end < p.synced {
		p.fatalf("recovered log ends at %d, before the acknowledged sync at %d", end, p.synced)
	}
	last := int64(0)
	if len(p.recs) > 0 {
		last = p.recs[len(p.recs)-1].end
	}
	if end > last {
		// Only records of the batch whose append failed, a prefix of it.
		raw, err := p.raw(l, last)
		if err != nil {
			p.fatalf("%v", err)
		}
		i := 0
		err = ReadRecords(bytes.NewReader(raw), "tail", last, func(r RecordInfo) error {
			k := queueKey{r.Topic, r.Queue}
			if i >= len(p.uncertain) {
				return fmt.Errorf("record at %d of %v was never appended", r.Offset, k)
			}
			e := p.uncertain[i]
			if e.Topic != r.Topic || e.Queue != r.Queue || !bytes.Equal(e.Payload, r.Payload) || r.QueueOffset != p.nexts[k] {
				return fmt.Errorf("record at %d (%v, queue offset %d) is not entry %d of the failed append", r.Offset, k, r.QueueOffset, i)
			}
			p.add(powerRec{k: k, qo: r.QueueOffset, payload: r.Payload, lo: r.Offset, end: r.Offset + int64(r.Size)})
			i++
			return nil
		})
		if err != nil {
			p.fatalf("recovered log ends at %d, past the last record acknowledged (%d): %v", end, last, err)
		}
	}
	p.uncertain = nil
	if end > 0 && !slices.ContainsFunc(p.recs, func(r powerRec) bool { return r.end == end }) {
		p.fatalf("recovered log ends at %d, inside a record", end)
	}
	// The survivors: the records ending at or before the end. A queue's
	// next offset follows its last survivor, and is at most past the last
	// offset handed out (a deletion's queue offsets file may have moved it
	// past records the down then lost, which is no harm: they are not
	// handed out again).
	lower := p.nexts
	p.nexts = map[queueKey]int64{}
	for k, v := range lower {
		p.nexts[k] = v
	}
	for k, qo := range p.drop(func(r powerRec) bool { return r.end > end }) {
		lower[k] = qo
	}
	byQueue := map[queueKey]map[int64]powerRec{}
	for k := range p.nexts {
		byQueue[k] = map[int64]powerRec{}
	}
	for _, r := range p.recs {
		byQueue[r.k][r.qo] = r
	}
	l.Queues(func(topic string, queue uint32, _, _ int64) {
		if k := (queueKey{topic, queue}); byQueue[k] == nil {
			byQueue[k] = map[int64]powerRec{} // never appended to: must be empty
		}
	})
	for k, want := range byQueue {
		first, next := l.QueueRange(k.topic, k.queue)
		if next < lower[k] || next > p.ever[k] {
			p.fatalf("%v: next queue offset %d after recovery, want %d to %d", k, next, lower[k], p.ever[k])
		}
		p.nexts[k] = next
		got, err := l.Read(k.topic, k.queue, first, 1<<30)
		if err != nil {
			p.fatalf("%v: read from %d: %v", k, first, err)
		}
		if int64(len(got)) != next-first {
			p.fatalf("%v: %d records read from %d, want up to %d", k, len(got), first, next)
		}
		for _, g := range got {
			w, ok := want[g.QueueOffset]
			if !ok || g.LogOffset != w.lo || !bytes.Equal(g.Payload, w.payload) {
				p.fatalf("%v: read record %d at %d (%q), which was not appended there (appended: %v, at %d, %q)", k, g.QueueOffset, g.LogOffset, g.Payload, ok, w.lo, w.payload)
			}
		}
		for _, w := range want {
			if w.end > start && (w.qo < first || w.qo >= next) { // else retention may have deleted it
				p.fatalf("%v: record %d (at %d, after the log start %d) is not in the queue's range [%d, %d)", k, w.qo, w.lo, start, first, next)
			}
		}
	}
	for side, want := range p.sides {
		f, err := p.mem.OpenRW(side)
		if err != nil {
			p.fatalf("side file %s of a completed truncation: %v", side, err)
		}
		got := make([]byte, len(want)+1)
		n, _ := f.ReadAt(got, 0)
		_ = f.Close()
		if !bytes.Equal(got[:n], want) {
			p.fatalf("side file %s: %d bytes, want the %d cut", side, n, len(want))
		}
	}
	p.synced = end
}

// A log that made its own data directory (and the directories above it)
// keeps a synced append through a power loss: the directories are durable
// before the append is acknowledged.
func TestPowerLossAfterTheLogMadeItsDirectory(t *testing.T) {
	mem := vfs.NewMemFS()
	cfg := Config{Dir: "/srv/ferrymq/data", FS: mem, Flush: FlushSync}
	l := openLog(t, cfg)
	mustAppend(t, l, []Entry{{Topic: "t", Payload: []byte("acknowledged")}}, false)
	cfg.FS = mem.CutPower(vfs.CrashOptions{})
	crash(l)
	l = openLog(t, cfg)
	defer l.Close()
	got, err := l.Read("t", 0, 0, 1<<20)
	if err != nil || len(got) != 1 || string(got[0].Payload) != "acknowledged" {
		t.Fatalf("the acknowledged append after a power loss: %d records, %v", len(got), err)
	}
	if pos := mustAppend(t, l, []Entry{{Topic: "t", Payload: []byte("next")}}, false); pos[0].QueueOffset != 1 {
		t.Fatalf("the next append got queue offset %d, the acknowledged one's is 0", pos[0].QueueOffset)
	}
}

// A process killed between creating a segment and syncing its directory
// leaves a segment whose name a power loss would take. Recovery makes it
// durable before appends go to it.
func TestPowerLossAfterAKilledRoll(t *testing.T) {
	mem := vfs.NewMemFS()
	must(t, mem.MkdirAll("/data"))
	must(t, mem.SyncDir("/"))
	efs := vfs.NewErrorFS(mem)
	cfg := Config{Dir: "/data", FS: efs, Flush: FlushSync, SegmentSize: 100}
	l := openLog(t, cfg)
	mustAppend(t, l, []Entry{{Topic: "t", Payload: make([]byte, 60)}}, false)
	created := false // the kill: every call after the new segment's creation fails
	efs.Inject(vfs.Fail(vfs.OpAll).Where(func(c vfs.Call) bool {
		if c.Op == vfs.OpCreate && strings.HasSuffix(c.Path, ".log") {
			created = true
			return false
		}
		return created
	}))
	if _, err := l.Append([]Entry{{Topic: "t", Payload: make([]byte, 60)}}, false); !errors.Is(err, vfs.ErrInjected) {
		t.Fatalf("the roll that was killed: %v", err)
	}
	crash(l)
	efs.DropAll()
	if names, _ := mem.List("/data"); len(slices.DeleteFunc(names, func(n string) bool { return filepath.Ext(n) != ".log" })) != 2 {
		t.Fatalf("the kill left segments %q, want the new one too", names)
	}

	l = openLog(t, cfg) // the page cache survived the kill
	pos := mustAppend(t, l, []Entry{{Topic: "t", Payload: []byte("acknowledged")}}, false)
	cfg.FS = mem.CutPower(vfs.CrashOptions{})
	crash(l)
	l = openLog(t, cfg)
	defer l.Close()
	if _, next := l.QueueRange("t", 0); next != pos[0].QueueOffset+1 {
		t.Fatalf("after the power loss the queue's next offset is %d, want %d: the acknowledged append was lost", next, pos[0].QueueOffset+1)
	}
}

// A deletion that did not finish (here a removal fails; a power loss can
// undo one too) leaves the queue offsets file for a later start than the
// log has. A truncation that then cuts every record of a queue gives the
// queue back the offset of its first record cut, not that file's.
func TestTruncateAfterAnUnfinishedDeletion(t *testing.T) {
	dir := t.TempDir()
	efs := vfs.NewErrorFS(vfs.Default)
	cfg := Config{Dir: dir, FS: efs, SegmentSize: 200}
	l := openLog(t, cfg)
	at := func(q uint32) Position {
		return mustAppend(t, l, []Entry{{Topic: "t", Queue: q, Payload: make([]byte, 60)}}, false)[0]
	}
	at(0)
	at(0)      // segment 0: queue 0's offsets 0 and 1
	b := at(1) // segment 1: queue 1's offset 0, then queue 0's 2
	at(0)
	last := at(0) // segment 2: queue 0's 3
	if l.StartOffset() != 0 || b.LogOffset == 0 || last.LogOffset <= b.End {
		t.Fatalf("layout: queue 1's record at %d, the last at %d", b.LogOffset, last.LogOffset)
	}
	fail := vfs.Fail(vfs.OpRemove).Path("*.log")
	efs.Inject(fail)
	if _, err := l.DeleteBefore(last.LogOffset); !errors.Is(err, vfs.ErrInjected) {
		t.Fatalf("delete with a failing removal: %v", err)
	}
	efs.Drop(fail)
	if _, err := l.Truncate(b.LogOffset, filepath.Join(dir, "truncated", SideFileName(b.LogOffset, 1))); err != nil {
		t.Fatal(err)
	}
	for _, reopened := range []bool{false, true} {
		if reopened {
			must(t, l.Close())
			l = openLog(t, cfg)
		}
		if first, next := l.QueueRange("t", 1); first != 0 || next != 0 {
			t.Fatalf("reopened %v: queue 1 holds [%d, %d) after its only record was cut, want [0, 0)", reopened, first, next)
		}
		if first, next := l.QueueRange("t", 0); first != 0 || next != 2 {
			t.Fatalf("reopened %v: queue 0 holds [%d, %d), want [0, 2)", reopened, first, next)
		}
	}
	must(t, l.Close())
}

// A power loss takes an append that was not synced and keeps one that
// was: the tests above run on a crash model that does drop what it should.
func TestPowerLossDropsUnsyncedAppends(t *testing.T) {
	mem := vfs.NewMemFS()
	l := openLog(t, Config{Dir: "/data", FS: mem, FlushInterval: time.Hour, Pretouch: -1})
	mustAppend(t, l, []Entry{{Topic: "t", Payload: []byte("synced")}}, true)
	mustAppend(t, l, []Entry{{Topic: "t", Payload: []byte("not synced")}}, false)
	img := mem.CutPower(vfs.CrashOptions{})
	crash(l)
	l = openLog(t, Config{Dir: "/data", FS: img, FlushInterval: time.Hour, Pretouch: -1})
	defer l.Close()
	if first, next := l.QueueRange("t", 0); first != 0 || next != 1 {
		t.Fatalf("after the power loss the queue holds [%d, %d), want the synced record alone", first, next)
	}
}

// Directories are synced where they are created, never per append:
// synced appends that create no file sync no directory.
func TestNoDirectorySyncPerAppend(t *testing.T) {
	efs := vfs.NewErrorFS(vfs.NewMemFS())
	l := openLog(t, Config{Dir: "/srv/ferrymq/data", FS: efs, Flush: FlushSync})
	defer l.Close()
	opened := efs.Calls(vfs.OpSyncDir)
	for i := range 300 {
		mustAppend(t, l, []Entry{{Topic: "t", Queue: uint32(i % 4), Payload: make([]byte, 100)}}, false)
	}
	if n := efs.Calls(vfs.OpSyncDir) - opened; n != 0 {
		t.Fatalf("%d directory syncs in 300 appends", n)
	}
	if opened < 4 { // the root, /srv, /srv/ferrymq and the log directory
		t.Fatalf("Open synced %d directories making /srv/ferrymq/data", opened)
	}
}

// Under FlushAsync an acknowledged append is durable once the flusher's
// next periodic sync covers it, without any caller asking: what a power
// loss can take is what was appended since the last of those syncs.
func TestAsyncAppendsSurviveAPowerLossAfterTheFlushInterval(t *testing.T) {
	mem := vfs.NewMemFS()
	cfg := Config{Dir: "/srv/ferrymq/data", FS: mem, FlushInterval: 20 * time.Millisecond, Pretouch: -1}
	l := openLog(t, cfg)
	var end int64
	for i := range 5 {
		end = mustAppend(t, l, []Entry{{Topic: "t", Payload: []byte{byte(i)}}}, false)[0].End
	}
	testwait.For(t, 5*time.Second, "the flusher's periodic sync", func() bool { return l.FlushedOffset() >= end })
	cfg.FS = mem.CutPower(vfs.CrashOptions{})
	crash(l)
	l = openLog(t, cfg)
	defer l.Close()
	if _, next := l.QueueRange("t", 0); next != 5 {
		t.Fatalf("after the power loss the queue's next offset is %d, want the 5 synced appends", next)
	}
}
