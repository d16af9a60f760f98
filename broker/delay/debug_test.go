package delay

import "fmt"

func (x *Index) dump() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := fmt.Sprintf("start %d pos %d w %d\n", x.start, x.pos, x.w)
	for id, b := range x.buckets {
		st, err := x.stateOf(b, false)
		s += fmt.Sprintf("bucket %d npending %d minAt %d mat %v err %v:", id, b.npending, b.minAt, b.st != nil, err)
		for at, e := range st.ents {
			s += fmt.Sprintf(" %d:%d/%d/h%d", at, e.st.Kind, e.hold, e.hidx)
		}
		s += "\n"
	}
	return s
}
