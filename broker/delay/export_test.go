package delay

// crash drops the index as a killed process would: no last checkpoint,
// but the items it followed are in its bucket files (the page cache),
// past what the checkpoint counts.
func (x *Index) crash() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.waitCheckpoint()
	_ = x.flushAll()
	x.closed = true
	_ = x.closeFiles()
}

// checkpointWritten waits until no checkpoint is in flight.
func (x *Index) checkpointWritten() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.waitCheckpoint()
}
