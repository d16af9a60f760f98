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

// The raft-secret handshake: with Config.RaftSecret, every raft connection
// opens with a challenge and response in both directions before raft reads
// or writes a byte of it, so that only nodes holding the metaservers' own
// secret speak raft to each other.
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
// The key is raftSecretKey(RaftSecret). It is never derived from the
// cluster token: every broker holds that token, and a broker must not be
// able to speak raft (a forged AppendEntries would write the registry, the
// ACL included). Until docs/security.md's move to the secret is done
// (Config.RaftAcceptClusterKey), a node also takes clusterTokenKey(token),
// the key the cluster token gave raft before the secret, and dials a peer
// that refuses its secret's key again with that one.
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

// The labels that separate the raft keys from every other use of their
// secrets.
const (
	raftSecretLabel   = "ferrymq raft secret v1"
	clusterTokenLabel = "ferrymq raft key v1"
)

// raftSecretKey is the handshake's key: HMAC-SHA256 of a fixed label keyed
// with the metaservers' raft secret.
func raftSecretKey(secret string) []byte { return labelKey(secret, raftSecretLabel) }

// clusterTokenKey is the key raft's handshake had before the raft secret:
// HMAC-SHA256 of a fixed label keyed with the cluster token, which every
// broker holds. Only Config.RaftAcceptClusterKey takes it.
func clusterTokenKey(token string) []byte { return labelKey(token, clusterTokenLabel) }

func labelKey(secret, label string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(label))
	return m.Sum(nil)
}

// raftKeys are the keys a node's raft handshake takes: the first is its
// raft secret's, which it dials with first; a second, in the move from the
// cluster token's key (Config.RaftAcceptClusterKey), is that key.
type raftKeys [][]byte

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
	errRaftNotHandshake = errors.New("the peer did not answer the raft-secret handshake (plaintext raft, or not a metaserver?)")
	errRaftBadMAC       = errors.New("the peer's answer is not made with this node's raft key (another -raft-secret-file, a node keyed by the cluster token, or not a metaserver?)")
)

// secretServe runs inner (nil: none) and then the listener's side of the
// raft-secret handshake on what inner returned, taking an answer made with
// any of keys; oldKey (nil: none) is told of a peer that proved keys[1:]
// rather than keys[0]. It reads a fixed number of bytes from the peer,
// nothing more, before the peer has proved a key.
func secretServe(inner handshakeFunc, keys raftKeys, id string, oldKey func(remote string)) handshakeFunc {
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
			return nil, fmt.Errorf("reading the raft-secret answer: %w", err)
		}
		if string(answer[:len(raftSecretMagic)]) != raftSecretMagic {
			return nil, errRaftNotHandshake
		}
		if v := answer[len(raftSecretMagic)]; v != raftSecretVersion {
			return nil, fmt.Errorf("the peer speaks raft-secret handshake version %d, this node %d", v, raftSecretVersion)
		}
		nonceD := answer[len(raftSecretMagic)+1 : len(raftSecretMagic)+1+raftNonceLen]
		got := answer[len(raftSecretMagic)+1+raftNonceLen:]
		for i, key := range keys {
			if !hmac.Equal(got, raftMAC(key, "dialer", nonceL, nonceD, id)) {
				continue
			}
			if _, err := c.Write(raftMAC(key, "listener", nonceL, nonceD, id)); err != nil {
				return nil, err
			}
			if i > 0 && oldKey != nil {
				oldKey(raw.RemoteAddr().String())
			}
			return c, nil
		}
		return nil, errRaftBadMAC
	}
}

// errRaftKeyRefused is a peer that closed the connection on this node's
// answer: it does not take the key the answer was made with.
var errRaftKeyRefused = errors.New("the peer refused this node's raft key")

// secretDialer dials with inner and then runs the dialer's side of the
// raft-secret handshake with keys[0], within timeout in all. A peer that
// refuses that key is dialed again with the next one, if keys has more.
func secretDialer(inner dialFunc, keys raftKeys) dialFunc {
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		start := time.Now()
		var err error
		for i, key := range keys {
			left := timeout - time.Since(start)
			if left <= 0 {
				break // err says why the last key failed
			}
			var c net.Conn
			if c, err = inner(addr, left); err != nil {
				return nil, err
			}
			_ = c.SetDeadline(start.Add(timeout))
			if err = secretClient(c, key); err == nil {
				_ = c.SetDeadline(time.Time{})
				return c, nil
			}
			_ = c.Close()
			if !errors.Is(err, errRaftKeyRefused) || i == len(keys)-1 {
				break
			}
		}
		return nil, fmt.Errorf("metaserver: raft-secret handshake with %s: %w", addr, err)
	}
}

func secretClient(c net.Conn, key []byte) error {
	var hello [raftHelloFixed + raftMaxIDLen]byte
	if _, err := io.ReadFull(c, hello[:raftHelloFixed]); err != nil {
		return fmt.Errorf("no handshake from the peer (does it run without -raft-secret-file?): %w", err)
	}
	if string(hello[:len(raftSecretMagic)]) != raftSecretMagic {
		return errors.New("the peer did not open the raft-secret handshake (does it run without -raft-secret-file?)")
	}
	if v := hello[len(raftSecretMagic)]; v != raftSecretVersion {
		return fmt.Errorf("the peer speaks raft-secret handshake version %d, this node %d", v, raftSecretVersion)
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
			return fmt.Errorf("%w: the peer %s (node %q) holds another -raft-secret-file, or is keyed by the cluster token (see the move to -raft-secret-file in docs/security.md)", errRaftKeyRefused, c.RemoteAddr(), id)
		}
		return fmt.Errorf("waiting for the peer's confirmation: %w", err)
	}
	if !hmac.Equal(confirm[:], raftMAC(key, "listener", nonceL, nonceD, id)) {
		return fmt.Errorf("the peer %s (node %q) does not hold this node's raft key", c.RemoteAddr(), id)
	}
	return nil
}

// isReset reports a connection the peer reset (it closed with our answer
// unread).
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET)
}
