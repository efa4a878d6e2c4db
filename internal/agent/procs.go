package agent

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// procTable starts processes and delivers their exit status. As PID 1 it
// also reaps every orphan that is reparented to it (zombies would
// otherwise count against the sandbox's pids limit); a single wait4(-1)
// loop does all reaping so that it never steals a status a caller waits for.
type procTable struct {
	reapAll bool

	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
}

func newProcTable(reapAll bool) *procTable {
	pt := &procTable{reapAll: reapAll, waiters: map[int]chan syscall.WaitStatus{}}
	if reapAll {
		sigs := make(chan os.Signal, 16)
		signal.Notify(sigs, syscall.SIGCHLD)
		go func() {
			for range sigs {
				pt.reap()
			}
		}()
	}
	return pt
}

// start starts a process; the returned channel yields its wait status once.
func (pt *procTable) start(path string, argv []string, attr *os.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	ch := make(chan syscall.WaitStatus, 1)
	// Hold the lock across start and registration so the reaper, which
	// takes it to dispatch, cannot see this PID before it is registered.
	pt.mu.Lock()
	p, err := os.StartProcess(path, argv, attr)
	if err != nil {
		pt.mu.Unlock()
		return 0, nil, err
	}
	pid := p.Pid
	if pt.reapAll {
		pt.waiters[pid] = ch
		pt.mu.Unlock()
		p.Release()
		pt.reap() // it may have exited before we registered
		return pid, ch, nil
	}
	pt.mu.Unlock()
	go func() {
		st, err := p.Wait()
		if err != nil {
			ch <- syscall.WaitStatus(255 << 8)
			return
		}
		ch <- st.Sys().(syscall.WaitStatus)
	}()
	return pid, ch, nil
}

func (pt *procTable) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		pt.mu.Lock()
		ch, ok := pt.waiters[pid]
		delete(pt.waiters, pid)
		pt.mu.Unlock()
		if ok {
			ch <- ws
		}
	}
}
