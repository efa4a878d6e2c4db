package sdnotify

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// EnvSocket is the variable systemd names the socket in.
const EnvSocket = "NOTIFY_SOCKET"

// The messages the daemon sends.
const (
	Ready    = "READY=1"
	Stopping = "STOPPING=1"
)

// Status is a STATUS= message: one line systemctl status shows.
func Status(s string) string {
	return "STATUS=" + strings.ReplaceAll(s, "\n", " ")
}

// MainPID is a MAINPID= message naming this process.
func MainPID() string { return fmt.Sprintf("MAINPID=%d", os.Getpid()) }

// A Notifier sends messages to systemd's socket. A nil *Notifier (no
// socket was given) sends nothing.
type Notifier struct {
	addr *net.UnixAddr
}

// FromEnv returns a Notifier for the socket $NOTIFY_SOCKET names, and
// unsets the variable (children must not inherit it). It returns nil,
// nil when the variable is unset or empty, and an error for an address
// that is not a unix socket's (systemd's vsock: addresses, for a service
// inside a VM, are not supported).
func FromEnv() (*Notifier, error) {
	name := os.Getenv(EnvSocket)
	os.Unsetenv(EnvSocket)
	if name == "" {
		return nil, nil
	}
	if name[0] != '/' && name[0] != '@' {
		return nil, fmt.Errorf("%s=%q is neither a socket path nor an abstract socket name (@NAME)", EnvSocket, name)
	}
	// Go's net package takes a leading '@' for the abstract namespace.
	return &Notifier{addr: &net.UnixAddr{Name: name, Net: "unixgram"}}, nil
}

// Send sends the messages together, in one datagram.
func (n *Notifier) Send(msgs ...string) error {
	if n == nil || len(msgs) == 0 {
		return nil
	}
	for _, m := range msgs {
		if !strings.Contains(m, "=") || strings.Contains(m, "\n") {
			return fmt.Errorf("sd_notify message %q is not one VARIABLE=value line", m)
		}
	}
	c, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer c.Close()
	msg := strings.Join(msgs, "\n") + "\n"
	if k, err := c.Write([]byte(msg)); err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	} else if k != len(msg) {
		return errors.New("sd_notify: short write")
	}
	return nil
}
