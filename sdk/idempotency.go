package sdk

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/nookhq/nook/api"
)

type idempotencyKey struct{}

// WithIdempotencyKey makes the create, fork or snapshot called with ctx
// idempotent: the daemon does it once per key (1-255 printable ASCII
// characters, kept 24 hours per token), and a retry with the same key and
// the same request (after a timeout, a dropped connection, a daemon
// restart) gets the first call's result instead of making a second
// sandbox. The same key with another request is an *Error (409). Other
// calls ignore it.
//
//	ctx := sdk.WithIdempotencyKey(ctx, sdk.NewIdempotencyKey())
//	sb, err := c.CreateSandbox(ctx, req) // retry with the same ctx
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKey{}, key)
}

// NewIdempotencyKey returns a random key.
func NewIdempotencyKey() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func setIdempotencyKey(ctx context.Context, h interface{ Set(string, string) }) {
	if k, _ := ctx.Value(idempotencyKey{}).(string); k != "" {
		h.Set(api.IdempotencyKeyHeader, k)
	}
}
