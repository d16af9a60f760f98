package delay

// journal holds the effects of the records since W, in log order, in
// blocks of journalBlock: appending never copies what it holds (a slice
// grown by doubling copied every effect again and again, a sixth of a
// busy master's CPU), and a checkpoint drops whole blocks from the front,
// keeping a few for reuse.
type journal struct {
	blocks [][]effect // every block but the last is full
	head   int        // effects of blocks[0] already dropped
	n      int        // effects held
	added  int64      // effects ever added
	spare  [][]effect // emptied blocks, for reuse
}

const (
	journalBlock = 4096
	journalSpare = 8
)

func (j *journal) len() int { return j.n }

func (j *journal) add(ef effect) {
	last := len(j.blocks) - 1
	if last < 0 || len(j.blocks[last]) == journalBlock {
		var b []effect
		if k := len(j.spare) - 1; k >= 0 {
			b, j.spare = j.spare[k], j.spare[:k]
		} else {
			b = make([]effect, 0, journalBlock)
		}
		j.blocks = append(j.blocks, b)
		last++
	}
	j.blocks[last] = append(j.blocks[last], ef)
	j.n++
	j.added++
}

// at is the i-th effect held, 0 <= i < len().
func (j *journal) at(i int) *effect {
	i += j.head
	return &j.blocks[i/journalBlock][i%journalBlock]
}

// drop forgets the first k effects.
func (j *journal) drop(k int) {
	j.n -= k
	j.head += k
	full := j.head / journalBlock
	if j.n == 0 {
		full = len(j.blocks)
	}
	for _, b := range j.blocks[:full] {
		if len(j.spare) < journalSpare {
			clear(b) // no pointers kept alive by a spare block
			j.spare = append(j.spare, b[:0])
		}
	}
	j.blocks = append(j.blocks[:0], j.blocks[full:]...)
	clear(j.blocks[len(j.blocks) : full+len(j.blocks)])
	j.head -= full * journalBlock
	if j.n == 0 {
		j.head = 0
	}
}

// reset forgets every effect and the spare blocks (added stays).
func (j *journal) reset() { *j = journal{added: j.added} }
