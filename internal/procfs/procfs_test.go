package procfs

import (
	"os"
	"os/exec"
	"testing"
)

func TestStartTime(t *testing.T) {
	if StartTime(os.Getpid()) == 0 {
		t.Fatal("no start time for this process")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if st := StartTime(cmd.Process.Pid); st != 0 {
		t.Fatalf("a reaped process has start time %d", st)
	}
	if StartTime(-1) != 0 || CPUTicks(-1) != 0 {
		t.Fatal("a bad PID has figures")
	}
}

func TestCPUTicks(t *testing.T) {
	for i := 0; CPUTicks(os.Getpid()) == 0 && i < 1e9; i++ {
	}
	if CPUTicks(os.Getpid()) == 0 {
		t.Fatal("no CPU time after a busy loop")
	}
}
