package storage

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// Key tables: see "Keys" in the package doc for the format and the rules;
// this file encodes and decodes them.

const (
	keysMagic        = "FYKT"
	keysVersion      = 1
	keysHeaderSize   = 80
	keyPairSize      = 24 // hash u64, log offset u64, store time u64
	keyFenceSize     = 20 // first pair's hash and log offset, page CRC
	keyPagePairs     = 170
	keyBloomBits     = 10 // bloom bits per key
	keyBloomHashes   = 7
	keysFileSuffix   = ".keys"
	maxKeysFileBytes = 1 << 40
)

// keyHash is the 64-bit FNV-1a hash of key: fixed, so that the key tables
// mean the same on every machine and after every restart.
func keyHash(key []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range key {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// keyRef is one key of one record: its hash, the record's log offset and
// store time.
type keyRef struct {
	hash uint64
	at   int64
	time int64
}

// less orders refs as a key table lists them: by hash, then log offset.
func (r keyRef) less(o keyRef) bool {
	return r.hash < o.hash || r.hash == o.hash && r.at < o.at
}

// appendOffset appends log offset at to offsets found newest first, once
// (a record may give a key twice).
func appendOffset(out []int64, at int64) []int64 {
	if len(out) > 0 && out[len(out)-1] == at {
		return out
	}
	return append(out, at)
}

// keyTable is the key table file of one index chunk, its header read. Its
// file is read through an indexChunk (opened on first use, counted among
// the log's open chunk files, closed with its last reader once dropped).
type keyTable struct {
	f          *indexChunk
	last       chunkLast
	minT, maxT int64 // store times of the range's keyed records
	pairs      int64
	hashes     int
	bloomLen   int64
	metaCRC    uint32
	bad        atomic.Bool // did not check out: scanned instead, rebuilt
}

func (t *keyTable) pages() int64 { return (t.pairs + keyPagePairs - 1) / keyPagePairs }

func (t *keyTable) metaLen() int64 { return t.bloomLen + t.pages()*keyFenceSize }

func (t *keyTable) pairsAt() int64 { return keysHeaderSize + t.metaLen() }

func keyTableName(dir string, from int64) string {
	return filepath.Join(dir, indexDirName, fmt.Sprintf("%0*d%s", indexNameDigits, from, keysFileSuffix))
}

// bloomBytes is the size of the bloom filter of n keys.
func bloomBytes(n int) int {
	if n == 0 {
		return 0
	}
	return (n*keyBloomBits + 63) / 64 * 8
}

// bloomBit is the i-th bit of hash h in a filter of m bits (double
// hashing: the hash's halves are the two hashes).
func bloomBit(h uint64, i int, m uint64) uint64 {
	return ((h & math.MaxUint32) + uint64(i)*(h>>32|1)) % m
}

func bloomMayHold(bloom []byte, hashes int, h uint64) bool {
	m := uint64(len(bloom)) * 8
	if m == 0 {
		return false
	}
	for i := range hashes {
		b := bloomBit(h, i, m)
		if bloom[b/8]&(1<<(b%8)) == 0 {
			return false
		}
	}
	return true
}

// encodeKeyTable lays out the key table of the chunk [from, to) ending on
// last, from its refs (in any order; sorted here).
func encodeKeyTable(from, to int64, last chunkLast, refs []keyRef) []byte {
	refs = sortRefs(refs)
	minT, maxT := int64(math.MaxInt64), int64(math.MinInt64)
	bloom := make([]byte, bloomBytes(len(refs)))
	for _, r := range refs {
		minT, maxT = min(minT, r.time), max(maxT, r.time)
		for i := range keyBloomHashes {
			b := bloomBit(r.hash, i, uint64(len(bloom))*8)
			bloom[b/8] |= 1 << (b % 8)
		}
	}
	pairs := make([]byte, 0, len(refs)*keyPairSize)
	for _, r := range refs {
		pairs = binary.BigEndian.AppendUint64(pairs, r.hash)
		pairs = binary.BigEndian.AppendUint64(pairs, uint64(r.at))
		pairs = binary.BigEndian.AppendUint64(pairs, uint64(r.time))
	}
	meta := bloom
	for p := 0; p < len(refs); p += keyPagePairs {
		page := pairs[p*keyPairSize : min(p+keyPagePairs, len(refs))*keyPairSize]
		meta = append(meta, page[:16]...)
		meta = binary.BigEndian.AppendUint32(meta, crc32.Checksum(page, castagnoli))
	}
	b := make([]byte, keysHeaderSize, keysHeaderSize+len(meta)+len(pairs))
	copy(b, keysMagic)
	binary.BigEndian.PutUint16(b[4:], keysVersion)
	binary.BigEndian.PutUint16(b[6:], keyBloomHashes)
	binary.BigEndian.PutUint64(b[8:], uint64(from))
	binary.BigEndian.PutUint64(b[16:], uint64(to))
	binary.BigEndian.PutUint64(b[24:], uint64(last.at))
	binary.BigEndian.PutUint32(b[32:], last.crc)
	binary.BigEndian.PutUint32(b[36:], uint32(len(bloom)))
	binary.BigEndian.PutUint64(b[40:], uint64(len(refs)))
	binary.BigEndian.PutUint64(b[48:], uint64(minT))
	binary.BigEndian.PutUint64(b[56:], uint64(maxT))
	binary.BigEndian.PutUint32(b[64:], crc32.Checksum(meta, castagnoli))
	binary.BigEndian.PutUint32(b[68:], crc32.Checksum(b[:68], castagnoli))
	b = append(b, meta...)
	return append(b, pairs...)
}

// readKeyTable reads and checks the header of the key table of the chunk
// [from, to) ending on last (its bloom filter, fences and pages are checked
// as lookups read them). A file that does not check out is an errBadChunk.
func readKeyTable(fs vfs.FS, name string, from, to int64, last chunkLast) (*keyTable, error) {
	f, err := fs.OpenRW(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	if size < keysHeaderSize {
		return nil, fmt.Errorf("%w: key table of %d bytes, shorter than a header", errBadChunk, size)
	}
	var h [keysHeaderSize]byte
	if _, err := f.ReadAt(h[:], 0); err != nil {
		return nil, err
	}
	if string(h[:4]) != keysMagic || binary.BigEndian.Uint16(h[4:]) != keysVersion ||
		crc32.Checksum(h[:68], castagnoli) != binary.BigEndian.Uint32(h[68:]) {
		return nil, fmt.Errorf("%w: not a key table of this version", errBadChunk)
	}
	t := &keyTable{
		f:        &indexChunk{from: from, to: to, name: name, fs: fs},
		last:     chunkLast{at: int64(binary.BigEndian.Uint64(h[24:])), crc: binary.BigEndian.Uint32(h[32:])},
		hashes:   int(binary.BigEndian.Uint16(h[6:])),
		bloomLen: int64(binary.BigEndian.Uint32(h[36:])),
		pairs:    int64(binary.BigEndian.Uint64(h[40:])),
		minT:     int64(binary.BigEndian.Uint64(h[48:])),
		maxT:     int64(binary.BigEndian.Uint64(h[56:])),
		metaCRC:  binary.BigEndian.Uint32(h[64:]),
	}
	if int64(binary.BigEndian.Uint64(h[8:])) != from || int64(binary.BigEndian.Uint64(h[16:])) != to || t.last != last {
		return nil, fmt.Errorf("%w: key table of another chunk", errBadChunk)
	}
	if t.pairs < 0 || t.pairs > maxKeysFileBytes/keyPairSize || t.bloomLen != int64(bloomBytes(int(t.pairs))) ||
		t.hashes < 1 || t.hashes > 64 || t.pairsAt()+t.pairs*keyPairSize != size {
		return nil, fmt.Errorf("%w: key table of %d bytes does not add up", errBadChunk, size)
	}
	return t, nil
}

// keyFence is the first pair of a page of a key table.
type keyFence struct {
	hash uint64
	at   int64
	crc  uint32
}

// keyFences is the fences of a key table as the file lists them, decoded
// one at a time (a lookup looks at a few of them).
type keyFences []byte

func (f keyFences) len() int { return len(f) / keyFenceSize }

func (f keyFences) at(i int) keyFence {
	e := f[i*keyFenceSize:]
	return keyFence{binary.BigEndian.Uint64(e), int64(binary.BigEndian.Uint64(e[8:])), binary.BigEndian.Uint32(e[16:])}
}

// metaBufs holds buffers for the bloom filters and fences lookups read,
// so that a lookup over many chunks does not make as much garbage.
var metaBufs = sync.Pool{New: func() any { return new([]byte) }}

// readMeta reads and checks the bloom filter and the page fences into
// *buf (grown if it must).
func (t *keyTable) readMeta(buf *[]byte) (bloom []byte, fences keyFences, err error) {
	b := slices.Grow((*buf)[:0], int(t.metaLen()))[:t.metaLen()]
	*buf = b
	if err := t.f.readAt(b, keysHeaderSize); err != nil {
		return nil, nil, err
	}
	if crc32.Checksum(b, castagnoli) != t.metaCRC {
		return nil, nil, fmt.Errorf("%w: key table %s: bloom filter or fences do not check out", errBadChunk, t.f.name)
	}
	return b[:t.bloomLen], keyFences(b[t.bloomLen:]), nil
}

// readPage reads and checks page i, whose fence is fe.
func (t *keyTable) readPage(i int64, fe keyFence) ([]keyRef, error) {
	n := min(keyPagePairs, t.pairs-i*keyPagePairs)
	b := make([]byte, n*keyPairSize)
	if err := t.f.readAt(b, t.pairsAt()+i*keyPagePairs*keyPairSize); err != nil {
		return nil, err
	}
	if crc32.Checksum(b, castagnoli) != fe.crc {
		return nil, fmt.Errorf("%w: key table %s: page %d does not check out", errBadChunk, t.f.name, i)
	}
	refs := make([]keyRef, n)
	for j := range refs {
		e := b[j*keyPairSize:]
		refs[j] = keyRef{binary.BigEndian.Uint64(e), int64(binary.BigEndian.Uint64(e[8:])), int64(binary.BigEndian.Uint64(e[16:]))}
	}
	return refs, nil
}

// find returns the log offsets of the pairs of hash h below log offset
// before that keep accepts, newest first, at most want of them, and the
// bytes it read. A table that does not check out is an errBadChunk.
func (t *keyTable) find(h uint64, before int64, want int, keep func(keyRef) bool) ([]int64, int64, error) {
	if t.pairs == 0 {
		return nil, 0, nil
	}
	buf := metaBufs.Get().(*[]byte)
	defer metaBufs.Put(buf)
	bloom, fences, err := t.readMeta(buf)
	if err != nil {
		return nil, 0, err
	}
	read := int64(len(bloom) + len(fences))
	if !bloomMayHold(bloom, t.hashes, h) {
		return nil, read, nil
	}
	probe := keyRef{hash: h, at: before}
	// The last page whose first pair is below the probe holds the pair
	// just below it; earlier pages follow while they hold hash h.
	p := int64(sort.Search(fences.len(), func(i int) bool {
		fe := fences.at(i)
		return !(keyRef{hash: fe.hash, at: fe.at}).less(probe)
	})) - 1
	var out []int64
	for ; p >= 0 && len(out) < want; p-- {
		refs, err := t.readPage(p, fences.at(int(p)))
		if err != nil {
			return nil, read, err
		}
		read += int64(len(refs)) * keyPairSize
		j := sort.Search(len(refs), func(i int) bool { return !refs[i].less(probe) })
		for j--; j >= 0 && refs[j].hash == h && len(out) < want; j-- {
			if keep(refs[j]) {
				out = appendOffset(out, refs[j].at)
			}
		}
		if j >= 0 || refs[0].hash != h {
			break // the pairs of h start in this page
		}
	}
	return out, read, nil
}

// sortRefs returns refs (in log order) sorted by hash, then log offset: a
// radix sort by the hash's top 32 bits, 16 at a time, which keeps the log
// order of equal keys, then the few runs that share those bits sorted by
// the whole hash. It is several times faster than a comparison sort of the
// hundred thousand refs of a chunk.
func sortRefs(refs []keyRef) []keyRef {
	a, b := slices.Clone(refs), make([]keyRef, len(refs))
	count := make([]int, 1<<16+1)
	for _, shift := range []uint{32, 48} {
		clear(count)
		for _, r := range a {
			count[r.hash>>shift&0xffff+1]++
		}
		for i := 1; i < len(count); i++ {
			count[i] += count[i-1]
		}
		for _, r := range a {
			d := r.hash >> shift & 0xffff
			b[count[d]] = r
			count[d]++
		}
		a, b = b, a
	}
	for i := 0; i < len(a); {
		j := i + 1
		for j < len(a) && a[j].hash>>32 == a[i].hash>>32 {
			j++
		}
		if j-i > 1 {
			slices.SortStableFunc(a[i:j], func(x, y keyRef) int { return cmp.Compare(x.hash, y.hash) })
		}
		i = j
	}
	return a
}
