package preview

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strconv"
	"strings"
	"time"
)

// A token is base64url (unpadded) of the expiry, Unix seconds in 8
// bytes big-endian, then the first macLen bytes of
//
//	HMAC-SHA256(key, "nook-preview\x00" + sandboxID + "\x00" + nonce + "\x00" + port + "\x00" + expiry)
//
// with port and expiry in decimal. The NULs keep the fields apart: an ID
// or a nonce holding a NUL could make two field lists one input, so
// verify refuses those.
const (
	macLen   = 20
	tokenRaw = 8 + macLen
)

// tokenEncoding is strict: one token has one spelling.
var (
	tokenEncoding = base64.RawURLEncoding.Strict()
	tokenLen      = tokenEncoding.EncodedLen(tokenRaw)
)

// Token mints an access token for one port of one sandbox (by ID) under
// one exposure of it (nonce, PortInfo.Nonce: the daemon draws a new one
// each time it exposes the port and drops it when it unexposes the
// port, which revokes every token minted for it), valid until exp (to
// the second).
func (s *Server) Token(sandboxID string, port int, nonce string, exp time.Time) string {
	var raw [tokenRaw]byte
	e := exp.Unix()
	binary.BigEndian.PutUint64(raw[:8], uint64(e))
	copy(raw[8:], s.mac(nil, sandboxID, port, nonce, e))
	return tokenEncoding.EncodeToString(raw[:])
}

// mac appends the token's MAC (macLen bytes) to dst.
func (s *Server) mac(dst []byte, sandboxID string, port int, nonce string, exp int64) []byte {
	m := hmac.New(sha256.New, s.key)
	var buf [64]byte
	m.Write(append(buf[:0], "nook-preview\x00"...))
	m.Write([]byte(sandboxID))
	m.Write(append(buf[:0], 0))
	m.Write([]byte(nonce))
	b := append(buf[:0], 0)
	b = strconv.AppendInt(b, int64(port), 10)
	b = append(b, 0)
	b = strconv.AppendInt(b, exp, 10)
	m.Write(b)
	var sum [sha256.Size]byte
	return append(dst, m.Sum(sum[:0])[:macLen]...)
}

type tokenResult int

const (
	tokenBad tokenResult = iota
	tokenExpired
	tokenValid
)

// verify checks tok for sandbox id's port under the exposure nonce at
// now. The expiry it returns is meaningful only when the token is valid
// or expired (its MAC is right).
//
// An empty nonce opens nothing: a port the daemon exposed without one
// could not have its tokens revoked, so it fails closed.
func (s *Server) verify(tok, id string, port int, nonce string, now time.Time) (tokenResult, int64) {
	if len(tok) != tokenLen || nonce == "" || strings.IndexByte(id, 0) >= 0 || strings.IndexByte(nonce, 0) >= 0 {
		return tokenBad, 0
	}
	var raw [tokenRaw]byte
	if n, err := tokenEncoding.Decode(raw[:], []byte(tok)); err != nil || n != tokenRaw {
		return tokenBad, 0
	}
	exp := int64(binary.BigEndian.Uint64(raw[:8]))
	var buf [macLen]byte
	if !hmac.Equal(raw[8:], s.mac(buf[:0], id, port, nonce, exp)) {
		return tokenBad, 0
	}
	if now.Unix() >= exp {
		return tokenExpired, exp
	}
	return tokenValid, exp
}
