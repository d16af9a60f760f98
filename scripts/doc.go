// Package scripts keeps the shell scripts that build the binaries, start and
// stop a local cluster, and run benchmarks and fault drills, and the small Go
// programs they run (failoverprobe). This file exists so the directory is
// listed with the module's other top-level parts.
package scripts
