package agent

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/pkg/sftp"
)

// SFTPServerArg is the argument that makes the agent's binary an SFTP
// server on its stdin and stdout (SFTPServerMain) instead of the agent.
// The daemon's SSH endpoint runs it in the sandbox as the login user, as
// an exec of SFTPServerPath: the kernel checks every file operation
// against that user, and the client's SFTP packets are parsed inside the
// sandbox, never by the daemon.
const SFTPServerArg = "sftp-server"

// SFTPServerPath runs the agent's own binary: an exec's child is forked
// from the agent, so /proc/self/exe names the agent's executable in a
// container and in a vm alike, wherever it is.
const SFTPServerPath = "/proc/self/exe"

// SFTPServerMain serves SFTP on stdin and stdout until the client ends
// the session, relative paths resolved against $HOME; it returns the
// process's exit code.
func SFTPServerMain() int {
	var opts []sftp.ServerOption
	if home := os.Getenv("HOME"); home != "" {
		if fi, err := os.Stat(home); err == nil && fi.IsDir() {
			opts = append(opts, sftp.WithServerWorkingDirectory(home))
		}
	}
	srv, err := sftp.NewServer(stdio{os.Stdin, os.Stdout}, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sftp-server:", err)
		return 1
	}
	if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintln(os.Stderr, "sftp-server:", err)
		return 1
	}
	return 0
}

type stdio struct {
	io.Reader
	io.WriteCloser
}
