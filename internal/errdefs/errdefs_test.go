package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

func TestCategoriesSurviveWrapping(t *testing.T) {
	err := fmt.Errorf("create sandbox: %w", NotFound("template %q not found", "x"))
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("category lost: %v", err)
	}
	if got := NotFound("template %q not found", "x").Error(); got != `template "x" not found` {
		t.Fatalf("message: %q", got)
	}
}

func TestLimit(t *testing.T) {
	err := fmt.Errorf("create: %w", Limit("host limit reached: %d sandboxes exist", 3))
	if !errors.Is(err, ErrLimit) || errors.Is(err, ErrResourceExhausted) {
		t.Fatalf("category: %v", err)
	}
	if got := err.Error(); got != "create: host limit reached: 3 sandboxes exist" {
		t.Fatalf("message: %q", got)
	}
}
