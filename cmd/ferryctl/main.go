// Command ferryctl is ferrymq's admin CLI and load generator: it shows
// routes, topics, broker groups and the Raft cluster, changes them, sends
// and reads messages, and benchmarks a cluster.
package main

import "os"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
