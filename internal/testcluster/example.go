package testcluster

import (
	"log"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/routing"
)

// ForExample starts what a runnable example of the SDKs sends to: a
// one-node metaserver that creates topics with one queue and a
// single-broker group. It returns the metaserver's address and a stop
// that closes both and removes their directory. An example has no
// testing.TB: an error ends the program (log.Fatal).
func ForExample() (metaAddr string, stop func()) {
	dir, err := os.MkdirTemp("", "ferrymq-example-")
	if err != nil {
		log.Fatal(err)
	}
	quiet := hclog.NewNullLogger()
	meta, err := metaserver.New(metaserver.Config{ID: "m1", Dir: dir + "/meta", RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		AutoCreateTopics: true, DefaultQueues: 1, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	if err := meta.Start([]metaserver.Peer{{ID: "m1", RaftAddr: meta.RaftAddr(), RPCAddr: meta.RPCAddr()}}); err != nil {
		log.Fatal(err)
	}
	b, err := broker.New(broker.Config{ID: "b1", Group: "g1", Role: routing.RoleMaster, Dir: dir + "/broker",
		Addr: "127.0.0.1:0", MetaAddrs: []string{meta.RPCAddr()}, HeartbeatInterval: 100 * time.Millisecond, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !b.Writable(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			log.Fatal("the example's broker did not become writable in 30 s")
		}
	}
	return meta.RPCAddr(), func() {
		_ = b.Close()
		_ = meta.Close()
		_ = os.RemoveAll(dir)
	}
}
