// Package errdefs defines the small set of error categories nook uses.
// Code deep in the daemon wraps one of these sentinels with %w and a
// message written for the user; only the API edge maps categories to
// HTTP status codes and stable error codes.
package errdefs

import (
	"errors"
	"fmt"
)

// The categories.
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnavailable        = errors.New("unavailable")
	ErrPermissionDenied   = errors.New("permission denied")
	// ErrLimit is a limit the host's operator set (nook serve
	// --max-sandboxes, --max-memory) that the request would go over: the
	// host refuses it rather than slow down for everyone.
	ErrLimit = errors.New("host limit reached")
)

// categorized carries a user-facing message and a category; Error returns
// only the message so the category name does not clutter what users read.
type categorized struct {
	msg string
	cat error
}

func (e *categorized) Error() string { return e.msg }
func (e *categorized) Unwrap() error { return e.cat }

func newf(cat error, format string, args ...any) error {
	return &categorized{msg: fmt.Sprintf(format, args...), cat: cat}
}

// Invalid returns an ErrInvalidArgument with a user-facing message.
func Invalid(format string, args ...any) error { return newf(ErrInvalidArgument, format, args...) }

// NotFound returns an ErrNotFound with a user-facing message.
func NotFound(format string, args ...any) error { return newf(ErrNotFound, format, args...) }

// Exists returns an ErrAlreadyExists with a user-facing message.
func Exists(format string, args ...any) error { return newf(ErrAlreadyExists, format, args...) }

// Precondition returns an ErrFailedPrecondition with a user-facing message.
func Precondition(format string, args ...any) error {
	return newf(ErrFailedPrecondition, format, args...)
}

// Exhausted returns an ErrResourceExhausted with a user-facing message.
func Exhausted(format string, args ...any) error { return newf(ErrResourceExhausted, format, args...) }

// Unavailable returns an ErrUnavailable with a user-facing message.
func Unavailable(format string, args ...any) error { return newf(ErrUnavailable, format, args...) }

// Denied returns an ErrPermissionDenied with a user-facing message.
func Denied(format string, args ...any) error { return newf(ErrPermissionDenied, format, args...) }

// Limit returns an ErrLimit with a user-facing message, which names the
// limit and the figures.
func Limit(format string, args ...any) error { return newf(ErrLimit, format, args...) }
