package agent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
)

// Version is the agent protocol version reported by ping.
const Version = "1"

// yamuxConfig is shared by both ends. A 1 MiB window per stream bounds the
// memory a flooding command can pin while keeping bulk transfers fast.
func yamuxConfig() *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.MaxStreamWindowSize = 1 << 20
	cfg.LogOutput = io.Discard
	cfg.EnableKeepAlive = false
	cfg.StreamCloseTimeout = 10 * time.Second
	// A paused sandbox acknowledges nothing until it resumes: a stream
	// opened meanwhile must wait, not close the whole session.
	cfg.StreamOpenTimeout = 0
	return cfg
}

// Server is the sandbox side of the protocol.
type Server struct {
	log   *slog.Logger
	procs *procTable
	// writeIdentity lets configure set the clock and hostname and write
	// /etc/hosts: true in a sandbox, false in tests on the host.
	writeIdentity bool

	sessions sessionTable
	volumes  VolumeMounter // a vm's volumes (SetVolumes); nil elsewhere

	tokenMu sync.Mutex
	token   *tokenKeeper // keeps the identity token file fresh (identity.go)

	mu sync.Mutex // guards baseEnv
	// baseEnv is the environment every process starts with (the sandbox's
	// own, as the backend gave it to the agent), before per-exec variables.
	baseEnv map[string]string
}

// NewServer returns a Server. reap makes it reap every orphan (set it
// when running as PID 1); identity makes it own the sandbox's clock,
// hostname and identity files (PID 1, or a vm's agent under systemd).
func NewServer(log *slog.Logger, reap, identity bool) *Server {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		// The agent's own settings, and what systemd tells the unit about
		// itself (its journal stream, invocation): not the commands'.
		if strings.HasPrefix(k, "NOOK_AGENT_") || k == "INVOCATION_ID" || k == "JOURNAL_STREAM" || k == "SYSTEMD_EXEC_PID" {
			continue
		}
		env[k] = v
	}
	if env["PATH"] == "" {
		env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	return &Server{log: log, procs: newProcTable(reap), baseEnv: env, writeIdentity: identity}
}

// Serve accepts connections from ln, each carrying a yamux session, until
// ln fails or ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go s.ServeConn(ctx, conn)
	}
}

// ServeConn serves one yamux session until it closes.
func (s *Server) ServeConn(ctx context.Context, conn net.Conn) {
	sess, err := yamux.Server(conn, yamuxConfig())
	if err != nil {
		s.log.Error("yamux session", "err", err)
		conn.Close()
		return
	}
	defer sess.Close()
	go func() { <-ctx.Done(); sess.Close() }()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		go s.handle(st)
	}
}

// frameWriter serializes frame writes from several goroutines.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (fw *frameWriter) write(kind byte, p []byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return api.WriteFrame(fw.w, kind, p)
}

func (fw *frameWriter) json(kind byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return fw.write(kind, b)
}

func (fw *frameWriter) fail(code, format string, args ...any) {
	_ = fw.json(api.FrameError, Error{Code: code, Message: fmt.Sprintf(format, args...)})
}

func (s *Server) handle(st net.Conn) {
	defer st.Close()
	fr := api.NewFrameReader(st)
	fw := &frameWriter{w: st}
	kind, payload, err := fr.Next()
	if err != nil {
		return
	}
	if kind != api.FrameJSON {
		fw.fail(CodeInvalidArgument, "first frame must be a request")
		return
	}
	req, err := DecodeRequest(payload)
	if err != nil {
		fw.fail(CodeInvalidArgument, "%v", err)
		return
	}
	switch req.Op {
	case OpPing:
		var uts syscall.Utsname
		_ = syscall.Uname(&uts)
		host, _ := os.Hostname()
		_ = fw.json(api.FrameJSON, Reply{Hostname: host, Kernel: utsString(uts.Release[:]), Version: Version})
	case OpExec:
		s.exec(st, fr, fw, req.Exec)
	case OpAttach:
		s.attach(fr, fw, req.Attach)
	case OpSignal:
		s.signal(fw, req.Signal)
	case OpProcesses:
		s.processes(fw)
	case OpStat, OpList, OpRead, OpWrite, OpMkdir, OpRemove, OpMove, OpChmod, OpTarGet, OpTarPut, OpWatch:
		s.files(st, fr, fw, req.Op, req.Files)
	case OpVolumes:
		s.serveVolumes(st, fr, fw, req.Volumes)
	case OpDial:
		s.dial(st, fw, req.Dial)
	case OpConfigure:
		if err := s.configure(req.Configure); err != nil {
			fw.fail(CodeInternal, "configure: %v", err)
			return
		}
		_ = fw.json(api.FrameJSON, Reply{})
	}
}

func (s *Server) configure(c *ConfigureRequest) error {
	s.mu.Lock()
	for _, k := range c.Unset {
		delete(s.baseEnv, k)
	}
	for k, v := range c.Env {
		s.baseEnv[k] = v
	}
	s.mu.Unlock()
	if !s.writeIdentity {
		return nil
	}
	if c.TimeUnixNano != 0 {
		ts := unix.NsecToTimespec(c.TimeUnixNano)
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return fmt.Errorf("set clock: %w", err)
		}
	}
	if len(c.Seed) > 0 {
		if err := reseed(c.Seed); err != nil {
			return fmt.Errorf("reseed the random pool: %w", err)
		}
	}
	if c.WakeOnly {
		s.wakeToken()
		return nil
	}
	if c.Net != nil {
		if err := configureNet(c.Net); err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}
	s.keepToken(c.Identity) // once a vm's eth0 is up
	if c.TrustCA != "" {
		if err := trustCA(c.TrustCA, api.SecretCAFile, api.SecretCABundle, systemBundles); err != nil {
			return fmt.Errorf("trust the secrets CA: %w", err)
		}
	}
	if cur, _ := os.Hostname(); cur != c.Hostname {
		if err := syscall.Sethostname([]byte(c.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n", c.Hostname)
	if err := os.WriteFile("/etc/hosts", []byte(hosts), 0o644); err != nil {
		return err
	}
	return os.WriteFile("/etc/hostname", []byte(c.Hostname+"\n"), 0o644)
}

// reseed credits seed to the kernel's entropy pool and forces the CRNG to
// reseed from it (RNDADDENTROPY, RNDRESEEDCRNG).
func reseed(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+len(seed))
	binary.NativeEndian.PutUint32(buf[0:], uint32(len(seed)*8))
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(seed)))
	copy(buf[8:], seed)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return e
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); e != 0 {
		return e
	}
	return nil
}

func utsString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// identity is who a process runs as.
type identity struct {
	cred *syscall.Credential
	home string
	name string
}

func lookupUser(spec string) (*identity, error) {
	if spec == "" {
		spec = "root"
	}
	name, group, _ := strings.Cut(spec, ":")
	var u *user.User
	var err error
	if _, perr := strconv.Atoi(name); perr == nil {
		u, err = user.LookupId(name)
		if err != nil { // a numeric uid need not exist in /etc/passwd
			u = &user.User{Uid: name, Gid: name, Username: name, HomeDir: "/"}
			err = nil
		}
	} else {
		u, err = user.Lookup(name)
	}
	if err != nil {
		return nil, fmt.Errorf("user %q does not exist in the sandbox", name)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	if group != "" {
		if g, err := strconv.ParseUint(group, 10, 32); err == nil {
			gid = g
		} else if gr, err := user.LookupGroup(group); err == nil {
			gid, _ = strconv.ParseUint(gr.Gid, 10, 32)
		} else {
			return nil, fmt.Errorf("group %q does not exist in the sandbox", group)
		}
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				cred.Groups = append(cred.Groups, uint32(n))
			}
		}
	}
	return &identity{cred: cred, home: u.HomeDir, name: u.Username}, nil
}

// lookPath finds file in the PATH of the process's environment (not the agent's).
func lookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}

// launch is a process ready to start: path, argv and attributes without files.
type launch struct {
	path string
	argv []string
	attr *os.ProcAttr
}

// prepare resolves who, where and what a request runs. Its error is an
// *AgentError the caller sends back as is.
func (s *Server) prepare(req *ExecRequest) (*launch, error) {
	id, err := lookupUser(req.User)
	if err != nil {
		return nil, &AgentError{Code: CodeInvalidArgument, Message: err.Error()}
	}
	env := make(map[string]string, len(s.baseEnv)+len(req.Env)+3)
	s.mu.Lock()
	for k, v := range s.baseEnv {
		env[k] = v
	}
	s.mu.Unlock()
	env["HOME"], env["USER"], env["LOGNAME"] = id.home, id.name, id.name
	for k, v := range req.Env {
		env[k] = v
	}
	envList := make([]string, 0, len(env))
	for k, v := range env {
		envList = append(envList, k+"="+v)
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = id.home
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			cwd = "/"
		}
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, &AgentError{Code: CodeInvalidArgument, Message: fmt.Sprintf("working directory %q does not exist in the sandbox", cwd)}
	}
	path, err := lookPath(req.Argv[0], env["PATH"])
	if err != nil {
		return nil, &AgentError{Code: CodeCommandNotFound, Message: fmt.Sprintf("command %q not found in the sandbox (PATH=%s)", req.Argv[0], env["PATH"])}
	}
	attr := &os.ProcAttr{Dir: cwd, Env: envList, Sys: &syscall.SysProcAttr{Setpgid: true, Credential: id.cred}}
	if id.cred.Uid == uint32(os.Getuid()) && id.cred.Gid == uint32(os.Getgid()) && len(id.cred.Groups) == 0 {
		attr.Sys.Credential = nil // no setgroups needed, works unprivileged too
	}
	return &launch{path: path, argv: req.Argv, attr: attr}, nil
}

// startError turns a failed start into an *AgentError.
func startError(argv0 string, err error) *AgentError {
	code := CodeInternal
	if errors.Is(err, os.ErrPermission) {
		code = CodePermissionDenied
	} else if errors.Is(err, os.ErrNotExist) {
		code = CodeCommandNotFound
	}
	return &AgentError{Code: code, Message: fmt.Sprintf("cannot start %q: %v", argv0, unwrapPathErr(err))}
}

func (fw *frameWriter) failWith(e *AgentError) {
	_ = fw.json(api.FrameError, Error{Code: e.Code, Message: e.Message})
}

func (s *Server) exec(st net.Conn, fr *api.FrameReader, fw *frameWriter, req *ExecRequest) {
	if req.Background || req.TTY {
		s.startSession(fr, fw, req)
		return
	}
	l, aerr := s.prepare(req)
	if aerr != nil {
		fw.failWith(aerr.(*AgentError))
		return
	}
	var err error
	var stdinR, stdinW *os.File
	if req.Stdin {
		if stdinR, stdinW, err = os.Pipe(); err != nil {
			fw.fail(CodeInternal, "pipe: %v", err)
			return
		}
		growPipe(stdinW)
	} else if stdinR, err = os.Open(os.DevNull); err != nil {
		fw.fail(CodeInternal, "open %s: %v", os.DevNull, err)
		return
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		fw.fail(CodeInternal, "pipe: %v", err)
		return
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		outR.Close()
		outW.Close()
		fw.fail(CodeInternal, "pipe: %v", err)
		return
	}
	l.attr.Files = []*os.File{stdinR, outW, errW}
	pid, done, err := s.procs.start(l.path, l.argv, l.attr)
	stdinR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		fw.failWith(startError(req.Argv[0], err))
		return
	}
	if err := fw.json(api.FrameJSON, Reply{PID: pid}); err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}

	killGroup := func(sig syscall.Signal) { _ = syscall.Kill(-pid, sig) }
	deadline := killAfter(req.TimeoutMS, pid)
	defer deadline.stop()

	// Input from the daemon: stdin, EOF, signals. When the daemon side goes
	// away (client disconnect), a foreground process dies with it.
	exited := make(chan struct{})
	go func() {
		defer func() {
			if stdinW != nil {
				stdinW.Close()
			}
		}()
		for {
			kind, p, err := fr.Next()
			if err != nil {
				select {
				case <-exited:
				default:
					killGroup(syscall.SIGKILL)
				}
				return
			}
			switch kind {
			case api.FrameStdin:
				if stdinW != nil {
					if _, err := stdinW.Write(p); err != nil {
						stdinW.Close()
						stdinW = nil
					}
				}
			case api.FrameEOF:
				if stdinW != nil {
					stdinW.Close()
					stdinW = nil
				}
			case api.FrameSignal:
				if sig, ok := signalByName(string(p)); ok {
					killGroup(sig)
				}
			}
		}
	}()

	var outputs sync.WaitGroup
	pump := func(r *os.File, kind byte) {
		defer outputs.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				if werr := fw.write(kind, buf[:n]); werr != nil {
					killGroup(syscall.SIGKILL)
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	outputs.Add(2)
	go pump(outR, api.FrameStdout)
	go pump(errR, api.FrameStderr)

	ws := <-done
	close(exited)
	drain(&outputs, outR, errR)

	status := exitStatus(ws)
	status.TimedOut = deadline.fired.Load()
	_ = fw.json(api.FrameExit, status)
}

// timeout kills a process group when its time is up.
type timeout struct {
	t     *time.Timer
	fired atomic.Bool
}

// killAfter arms a timeout of ms milliseconds for process group pid (none if ms <= 0).
func killAfter(ms int64, pid int) *timeout {
	to := &timeout{}
	if ms > 0 {
		to.t = time.AfterFunc(time.Duration(ms)*time.Millisecond, func() {
			to.fired.Store(true)
			syscall.Kill(-pid, syscall.SIGKILL)
		})
	}
	return to
}

func (to *timeout) stop() {
	if to.t != nil {
		to.t.Stop()
	}
}

// drain waits for the pumps reading a process's outputs after it exited,
// then closes them. Output written before the exit is still in the pipes,
// but children that outlive the process may hold them open, so it waits
// only briefly before cutting the reads short.
func drain(pumps *sync.WaitGroup, outputs ...*os.File) {
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(250 * time.Millisecond):
		for _, f := range outputs {
			f.SetReadDeadline(time.Now())
		}
		<-drained
	}
	closeAll(outputs)
}

// growPipe raises a pipe's buffer to 1 MiB (from 64 KiB) so bulk input
// flows with fewer wake-ups; where the kernel refuses, the default stays.
func growPipe(f *os.File) {
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 1<<20) })
	}
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "STOP": syscall.SIGSTOP,
	"CONT": syscall.SIGCONT, "WINCH": syscall.SIGWINCH, "ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM,
	"PIPE": syscall.SIGPIPE, "SEGV": syscall.SIGSEGV, "BUS": syscall.SIGBUS, "ILL": syscall.SIGILL,
	"FPE": syscall.SIGFPE, "TRAP": syscall.SIGTRAP, "SYS": syscall.SIGSYS, "XCPU": syscall.SIGXCPU,
}

func signalByName(name string) (syscall.Signal, bool) {
	name = strings.TrimPrefix(strings.ToUpper(name), "SIG")
	if s, ok := signals[name]; ok {
		return s, true
	}
	if n, err := strconv.Atoi(name); err == nil && n > 0 && n < 65 {
		return syscall.Signal(n), true
	}
	return 0, false
}

func signalName(sig syscall.Signal) string {
	for name, s := range signals {
		if s == sig {
			return name
		}
	}
	return strconv.Itoa(int(sig))
}
