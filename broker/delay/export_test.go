package delay

// crash drops the index as a killed process would: no last checkpoint.
func (x *Index) crash() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.closed = true
	_ = x.closeFiles()
}
