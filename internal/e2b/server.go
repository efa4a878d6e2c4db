package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"connectrpc.com/connect"

	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/nookhq/nook/internal/e2b/envdpb/process/processconnect"
	"github.com/nookhq/nook/internal/errdefs"
)

// EnvdVersion is the envd version nook reports: the SDKs turn on what
// each version brought (file metadata 0.6.2, watch entries 0.6.3,
// network mounts 0.6.4, octet-stream uploads 0.5.7, closing stdin 0.5.2)
// by it, and nook serves all of that.
const EnvdVersion = "0.6.4"

// EnvdPort is the port the SDKs address envd on (E2b-Sandbox-Port).
const EnvdPort = "49983"

// clientID is what E2B's API answers as every sandbox's (deprecated)
// clientID.
const clientID = "6532622b"

// Server is the E2B edge of one Manager.
type Server struct {
	m   *daemon.Manager
	log *slog.Logger
	key []byte // signs envd access tokens and file URLs; <data>/e2b.key
	// domain ends sandbox host names (PORT-ID.DOMAIN).
	domain string
	api    *http.ServeMux
	envd   *http.ServeMux
	procs  *procTable
	// nameCache keeps sandboxes' uid and gid names (names.go).
	nameCache nameCache
	// samples are sandboxes' CPU times at their last metric (snapshots.go).
	samplesMu sync.Mutex
	samples   map[string]cpuSample
}

// New returns the E2B edge of m, keeping its signing key in dataDir.
// domain is what sandboxes' host names end in (the SDKs' getHost(port)
// is PORT-ID.DOMAIN), e.g. localhost:3000.
func New(m *daemon.Manager, log *slog.Logger, dataDir, domain string) (*Server, error) {
	key, err := loadKey(filepath.Join(dataDir, "e2b.key"))
	if err != nil {
		return nil, fmt.Errorf("e2b: %w", err)
	}
	s := &Server{m: m, log: log, key: key, domain: domain, procs: newProcTable()}
	s.api = s.controlMux()
	s.envd = http.NewServeMux()
	// A message is at most 16 MiB (an input of stdin, a listing's
	// request): connect-go refuses larger ones before decoding them.
	// A message is compressed (for a client that asks) only when it is
	// big enough to gain: a process's events are mostly a few bytes,
	// and a gzip writer's reset per message cost more than they saved.
	opts := []connect.HandlerOption{connect.WithInterceptors(errorInterceptor{}), connect.WithReadMaxBytes(16 << 20),
		connect.WithCompressMinBytes(1024)}
	s.envd.Handle(processconnect.NewProcessHandler(&processService{s: s}, opts...))
	s.envd.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...))
	s.envd.HandleFunc("GET /health", s.health)
	s.envd.HandleFunc("GET /files", s.downloadFile)
	s.envd.HandleFunc("POST /files", s.uploadFile)
	return s, nil
}

// loadKey reads the edge's signing key, making it (32 random bytes,
// root's alone) on first use.
func loadKey(path string) ([]byte, error) {
	if b, err := os.ReadFile(path); err == nil && len(b) == 64 {
		return hex.DecodeString(string(b))
	}
	b := make([]byte, 32)
	rand.Read(b)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(hex.EncodeToString(b)), 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, err
	}
	return b, nil
}

// accessToken is the envd access token of a sandbox (by its ID, so a
// sandbox made again under the same name gets another).
func (s *Server) accessToken(sandboxID string) string {
	return s.sandboxMAC("envd-access-token", sandboxID)
}

// trafficToken is what a request to a port of a sandbox without public
// traffic carries (E2b-Traffic-Access-Token), E2B's trafficAccessToken.
func (s *Server) trafficToken(sandboxID string) string {
	return s.sandboxMAC("traffic-access-token", sandboxID)
}

// sandboxMAC is the edge's key's HMAC of a sandbox's ID for one purpose,
// 40 hex digits: tokens that need no storage and differ by purpose.
func (s *Server) sandboxMAC(purpose, sandboxID string) string {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(purpose + "\x00" + sandboxID))
	return hex.EncodeToString(h.Sum(nil))[:40]
}

// ServeHTTP routes a request: one that names a sandbox (E2b-Sandbox-Id)
// is envd traffic for that sandbox, anything else the control API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("E2b-Sandbox-Id") != "" || r.Header.Get("E2b-Sandbox-Port") != "" {
		s.serveSandbox(w, r)
		return
	}
	if id, port, ok := hostRoute(r.Host, s.domain); ok {
		r.Header.Set("E2b-Sandbox-Id", id)
		r.Header.Set("E2b-Sandbox-Port", port)
		s.serveSandbox(w, r)
		return
	}
	if r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" {
		s.serveSigned(w, r)
		return
	}
	s.api.ServeHTTP(w, r)
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

// statusOf maps nook's error categories to the HTTP status E2B's API
// answers them with.
func statusOf(err error) int {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden
	case errors.Is(err, errdefs.ErrResourceExhausted), errors.Is(err, errdefs.ErrLimit):
		return http.StatusTooManyRequests
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := statusOf(err)
	if status == http.StatusInternalServerError {
		s.log.Error("e2b request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, status, err.Error())
}

// codeOf maps nook's error categories to Connect codes, which the SDKs
// turn into their errors (NotFound: FileNotFoundError, AlreadyExists:
// makeDir's false, ...).
func codeOf(err error) connect.Code {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return connect.CodeNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return connect.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrAlreadyExists):
		return connect.CodeAlreadyExists
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return connect.CodeFailedPrecondition
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return connect.CodePermissionDenied
	case errors.Is(err, errdefs.ErrResourceExhausted), errors.Is(err, errdefs.ErrLimit):
		return connect.CodeResourceExhausted
	case errors.Is(err, errdefs.ErrUnavailable):
		return connect.CodeUnavailable
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	}
	return connect.CodeUnknown
}

// errorInterceptor gives every error a handler returns its Connect code.
type errorInterceptor struct{}

func (errorInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		return res, connectError(err)
	}
}

func (errorInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (errorInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return connectError(next(ctx, conn))
	}
}

func connectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(codeOf(err), err)
}

// userOf is the user a request names: envd takes it from HTTP basic auth
// (user name, no password); "" is the sandbox's default.
func userOf(r *http.Request) string {
	if u, _, ok := r.BasicAuth(); ok {
		return u
	}
	return ""
}
