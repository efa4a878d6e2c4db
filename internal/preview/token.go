package preview

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strconv"
	"time"
)

// A token is base64url (unpadded) of the expiry, Unix seconds in 8
// bytes big-endian, then the first macLen bytes of
// HMAC-SHA256(key, "nook-preview\x00" + sandboxID + "\x00" + port + "\x00" + expiry)
// with port and expiry in decimal.
const (
	macLen   = 20
	tokenRaw = 8 + macLen
)

// tokenEncoding is strict: one token has one spelling.
var (
	tokenEncoding = base64.RawURLEncoding.Strict()
	tokenLen      = tokenEncoding.EncodedLen(tokenRaw)
)

// Token mints an access token for one sandbox (by ID) and port, valid
// until exp (to the second).
func (s *Server) Token(sandboxID string, port int, exp time.Time) string {
	var raw [tokenRaw]byte
	e := exp.Unix()
	binary.BigEndian.PutUint64(raw[:8], uint64(e))
	copy(raw[8:], s.mac(nil, sandboxID, port, e))
	return tokenEncoding.EncodeToString(raw[:])
}

// mac appends the token's MAC (macLen bytes) to dst.
func (s *Server) mac(dst []byte, sandboxID string, port int, exp int64) []byte {
	m := hmac.New(sha256.New, s.key)
	var buf [64]byte
	b := append(buf[:0], "nook-preview\x00"...)
	m.Write(b)
	m.Write([]byte(sandboxID))
	b = append(buf[:0], 0)
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

// verify checks tok for sandbox id's port at now. The expiry it returns
// is meaningful only when the token is valid or expired (its MAC is
// right).
func (s *Server) verify(tok, id string, port int, now time.Time) (tokenResult, int64) {
	if len(tok) != tokenLen {
		return tokenBad, 0
	}
	var raw [tokenRaw]byte
	if n, err := tokenEncoding.Decode(raw[:], []byte(tok)); err != nil || n != tokenRaw {
		return tokenBad, 0
	}
	exp := int64(binary.BigEndian.Uint64(raw[:8]))
	var buf [macLen]byte
	if !hmac.Equal(raw[8:], s.mac(buf[:0], id, port, exp)) {
		return tokenBad, 0
	}
	if now.Unix() >= exp {
		return tokenExpired, exp
	}
	return tokenValid, exp
}
