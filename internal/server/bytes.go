package server

import "bytes"

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// bytesBuffer is a reusable write buffer for one frame.
type bytesBuffer struct{ b []byte }

func (w *bytesBuffer) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }
