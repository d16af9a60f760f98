package transport

import (
	"bufio"
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// tcpPair is the two ends of a loopback TCP connection, closed at the
// test's end.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if client, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	if server, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Close() })
	return client, server
}

// A body handed to the writer (putGiven) goes out in its place among the
// copied and guarded replies of its batch, byte for byte, and its release
// is called only once all of it was handed to the socket: a buffer given
// back earlier could be refilled by the next answer while the socket still
// had to read it. The batch goes in one writev without guards, piece by
// piece with them (each guarded reply still checked before it leaves) and
// on TLS.
func TestGivenBodiesKeepTheirPlace(t *testing.T) {
	for _, path := range []string{"writev", "guarded", "tls"} {
		t.Run(path, func(t *testing.T) {
			client, server := tcpPair(t)

			w := newWriter(1<<20, time.Second)
			w.tls = path == "tls" // writeTLS's chunked writes work on any connection
			var on atomic.Bool
			on.Store(true)
			var checked atomic.Int32
			var guards []*flipGuard
			type sent struct {
				body  []byte
				given bool
				end   int64 // the bytes written up to its last byte
			}
			var want []sent
			var early atomic.Int32 // releases called before their body's last byte was written
			var released atomic.Int32
			size := int64(0)
			for i := range 9 {
				body := bytes.Repeat([]byte{byte('a' + i)}, 1+i*(40<<10)) // 1 byte to 320 KiB
				f := protocol.Frame{Flags: protocol.FlagResponse, Opaque: uint32(i + 1), Body: body}
				size += int64(f.Size())
				var err error
				switch {
				case i%3 == 1:
					end := size
					err = w.putGiven(&f, 0, func() {
						if w.written.Load() < end {
							early.Add(1)
						}
						released.Add(1)
					})
					want = append(want, sent{body: body, given: true, end: end})
				case i%3 == 2 && path == "guarded":
					g := &flipGuard{on: &on, checked: &checked}
					guards = append(guards, g)
					err = w.put(&f, 0, g)
					want = append(want, sent{body: body})
				default:
					err = w.put(&f, 0, nil)
					want = append(want, sent{body: body})
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if w.givenBytes == 0 || int64(len(w.buf)+w.givenBytes) != size {
				t.Fatalf("the given bodies were copied: %d bytes buffered of %d, %d given", len(w.buf), size, w.givenBytes)
			}
			done := make(chan error, 1)
			go func() { done <- w.run(server) }()
			w.kick()
			defer func() {
				w.close(ErrConnLost)
				if err := <-done; err != nil {
					t.Errorf("run: %v", err)
				}
			}()
			br := bufio.NewReader(client)
			for i, s := range want {
				f, err := readFrame(br, protocol.MaxFrameSize, readAtOnce)
				if err != nil {
					t.Fatal(err)
				}
				if f.Opaque != uint32(i+1) || !bytes.Equal(f.Body, s.body) {
					t.Fatalf("frame %d: opaque %d, %d bytes: not the reply put in that place (given %v)", i+1, f.Opaque, len(f.Body), s.given)
				}
			}
			testwait.For(t, 5*time.Second, "every given body to be released", func() bool { return released.Load() == 3 })
			if n := early.Load(); n > 0 {
				t.Fatalf("%d given bodies released before their last byte was written", n)
			}
			for i, g := range guards {
				if g.checks.Load() != 1 || !g.allowed.Load() {
					t.Fatalf("guarded reply %d checked %d times", i, g.checks.Load())
				}
			}
			testwait.For(t, 5*time.Second, "the guarded replies to be marked sent", func() bool {
				for _, g := range guards {
					if g.sent.Load() != 1 {
						return false
					}
				}
				return true
			})
		})
	}
}
