package metaserver

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

// The cluster-key handshake: with Config.ClusterToken, every raft
// connection opens with a challenge and response in both directions before
// raft reads or writes a byte of it, so that only nodes holding the
// cluster's secret speak raft to each other.
//
//	listener -> dialer: hello   magic(8) version(1) nonceL(32) len(1) listener ID
//	dialer -> listener: answer  magic(8) version(1) nonceD(32) MAC("dialer")
//	listener -> dialer: confirm MAC("listener")
//
// MAC(role) is HMAC-SHA256(key, "ferrymq-raft" 0 role 0 nonceL nonceD ID):
// it covers both nonces (fresh on each end: no answer can be replayed), the
// listener's node ID and the role (neither end's MAC serves as the
// other's). The listener checks the dialer's in constant time and closes
// the connection without a word when it is wrong; the dialer checks the
// listener's, so it knows it reached a member of its cluster before it
// sends raft anything.
//
// The key is raftKey(token), never the token's hash: the metaservers hand
// the cluster principal's hash to the brokers (the ACL answers), and the
// hash alone must not let anyone speak raft.
//
// The handshake authenticates the connection's opening only: it does not
// encrypt or sign what follows, so someone who can rewrite traffic between
// two metaservers can still tamper with raft. Against that, TLS
// (-tls-cert, -tls-key, -tls-ca): with both, this handshake runs inside
// the TLS connection.

const (
	raftSecretMagic   = "\xc1fmqraft" // 0xc1: never a msgpack byte, so plaintext raft fails on it at once
	raftSecretVersion = 1
	raftNonceLen      = 32
	raftMACLen        = sha256.Size
	raftMaxIDLen      = 255
	raftHelloFixed    = len(raftSecretMagic) + 1 + raftNonceLen + 1
	raftAnswerLen     = len(raftSecretMagic) + 1 + raftNonceLen + raftMACLen
)

// raftKeyLabel separates the raft key from every other use of the token.
const raftKeyLabel = "ferrymq raft key v1"

// raftKey is the cluster-key handshake's key: HMAC-SHA256 of a fixed label
// keyed with the cluster token. The token's hash (auth.HashToken, which
// brokers learn) is SHA-256 of the token itself; it does not give this.
func raftKey(token string) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(raftKeyLabel))
	return m.Sum(nil)
}

func raftMAC(key []byte, role string, nonceL, nonceD []byte, id string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("ferrymq-raft\x00" + role + "\x00"))
	m.Write(nonceL)
	m.Write(nonceD)
	m.Write([]byte(id))
	return m.Sum(nil)
}

// Errors of the listener's side (logged, at most one per 10 s, and
// counted; the peer is told nothing).
var (
	errRaftNotHandshake = errors.New("the peer did not answer the cluster-key handshake (plaintext raft, or not a metaserver?)")
	errRaftBadMAC       = errors.New("the peer's answer is not made with this cluster's key (another -auth-cluster-token-file?)")
)

// secretServe runs inner (nil: none) and then the listener's side of the
// cluster-key handshake on what inner returned. It reads a fixed number of
// bytes from the peer, nothing more, before the peer has proved the key.
func secretServe(inner handshakeFunc, key []byte, id string) handshakeFunc {
	return func(raw net.Conn) (net.Conn, error) {
		c := raw
		if inner != nil {
			var err error
			if c, err = inner(raw); err != nil {
				return nil, err
			}
		}
		hello := make([]byte, 0, raftHelloFixed+len(id))
		hello = append(hello, raftSecretMagic...)
		hello = append(hello, raftSecretVersion)
		hello = append(hello, make([]byte, raftNonceLen)...)
		nonceL := hello[len(raftSecretMagic)+1 : len(raftSecretMagic)+1+raftNonceLen]
		_, _ = rand.Read(nonceL)
		hello = append(hello, byte(len(id)))
		hello = append(hello, id...)
		if _, err := c.Write(hello); err != nil {
			return nil, err
		}
		var answer [raftAnswerLen]byte
		if _, err := io.ReadFull(c, answer[:]); err != nil {
			return nil, fmt.Errorf("reading the cluster-key answer: %w", err)
		}
		if string(answer[:len(raftSecretMagic)]) != raftSecretMagic {
			return nil, errRaftNotHandshake
		}
		if v := answer[len(raftSecretMagic)]; v != raftSecretVersion {
			return nil, fmt.Errorf("the peer speaks cluster-key handshake version %d, this node %d", v, raftSecretVersion)
		}
		nonceD := answer[len(raftSecretMagic)+1 : len(raftSecretMagic)+1+raftNonceLen]
		got := answer[len(raftSecretMagic)+1+raftNonceLen:]
		if !hmac.Equal(got, raftMAC(key, "dialer", nonceL, nonceD, id)) {
			return nil, errRaftBadMAC
		}
		if _, err := c.Write(raftMAC(key, "listener", nonceL, nonceD, id)); err != nil {
			return nil, err
		}
		return c, nil
	}
}

// secretDialer dials with inner and then runs the dialer's side of the
// cluster-key handshake, within timeout in all.
func secretDialer(inner dialFunc, key []byte) dialFunc {
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		start := time.Now()
		c, err := inner(addr, timeout)
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(start.Add(timeout))
		if err := secretClient(c, key); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("metaserver: raft cluster-key handshake with %s: %w", addr, err)
		}
		_ = c.SetDeadline(time.Time{})
		return c, nil
	}
}

func secretClient(c net.Conn, key []byte) error {
	var hello [raftHelloFixed + raftMaxIDLen]byte
	if _, err := io.ReadFull(c, hello[:raftHelloFixed]); err != nil {
		return fmt.Errorf("no handshake from the peer (does it run without -auth-cluster-token-file?): %w", err)
	}
	if string(hello[:len(raftSecretMagic)]) != raftSecretMagic {
		return errors.New("the peer did not open the cluster-key handshake (does it run without -auth-cluster-token-file?)")
	}
	if v := hello[len(raftSecretMagic)]; v != raftSecretVersion {
		return fmt.Errorf("the peer speaks cluster-key handshake version %d, this node %d", v, raftSecretVersion)
	}
	nonceL := hello[len(raftSecretMagic)+1 : len(raftSecretMagic)+1+raftNonceLen]
	idLen := int(hello[raftHelloFixed-1])
	if _, err := io.ReadFull(c, hello[raftHelloFixed:raftHelloFixed+idLen]); err != nil {
		return fmt.Errorf("reading the peer's handshake: %w", err)
	}
	id := string(hello[raftHelloFixed : raftHelloFixed+idLen])

	answer := make([]byte, 0, raftAnswerLen)
	answer = append(answer, raftSecretMagic...)
	answer = append(answer, raftSecretVersion)
	answer = append(answer, make([]byte, raftNonceLen)...)
	nonceD := answer[len(raftSecretMagic)+1:]
	_, _ = rand.Read(nonceD)
	answer = append(answer, raftMAC(key, "dialer", nonceL, nonceD, id)...)
	if _, err := c.Write(answer); err != nil {
		return fmt.Errorf("sending the answer: %w", err)
	}
	var confirm [raftMACLen]byte
	if _, err := io.ReadFull(c, confirm[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
			return fmt.Errorf("the peer %s (node %q) refused this node's cluster key: the nodes' -auth-cluster-token-file differ", c.RemoteAddr(), id)
		}
		return fmt.Errorf("waiting for the peer's confirmation: %w", err)
	}
	if !hmac.Equal(confirm[:], raftMAC(key, "listener", nonceL, nonceD, id)) {
		return fmt.Errorf("the peer %s (node %q) does not hold this cluster's key", c.RemoteAddr(), id)
	}
	return nil
}

// isReset reports a connection the peer reset (it closed with our answer
// unread).
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET)
}
