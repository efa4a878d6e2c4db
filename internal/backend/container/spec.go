package container

import (
	"fmt"
	"sort"
	"syscall"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nookhq/nook/internal/core"
)

// agentPathInSandbox is where the host's nook-agent binary is bind-mounted, read-only.
const agentPathInSandbox = "/.nook/nook-agent"

// defaultCaps is the capability set of a sandbox: Docker's default set
// without the four a sandbox has no use for, which widen what it can do
// to its neighbours and the kernel:
//
//   - NET_RAW: raw and packet sockets (forged packets, ARP and DHCP
//     spoofing on the sandbox's link). ping works without it through
//     unprivileged ICMP sockets (net.ipv4.ping_group_range, set below).
//   - MKNOD: device nodes (the device cgroup denies their use, but
//     nothing else needs them).
//   - AUDIT_WRITE: messages into the host's audit log.
//   - SETFCAP: file capabilities, which would let a file grant what the
//     sandbox lacks to whoever runs it (package scripts that setcap fall
//     back to setuid, as Debian's iputils-ping does).
//
// Kept is what apt-get, package scripts, su/sudo, chown and services
// need: CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID,
// SETPCAP, NET_BIND_SERVICE, SYS_CHROOT. None reaches the host (no
// SYS_ADMIN, SYS_MODULE, NET_ADMIN, SYS_PTRACE...).
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_KILL",
}

// pingGroupRange lets every group open unprivileged ICMP echo sockets
// (what ping uses without CAP_NET_RAW). It is a per network namespace
// sysctl: the sandbox's own.
const pingGroupRange = "0 2147483647"

// pingGroupRangeUserns is pingGroupRange in a user namespace, whose
// gids end at 65535: a gid past them would be refused.
const pingGroupRangeUserns = "0 65535"

// generateSpec builds the OCI runtime spec of a sandbox. The bundle's
// rootfs is the sandbox's overlay mount; its network namespace is the one
// held at netns, and (m enabled) its user namespace the one held at
// userns, with m's mapping; the agent listens and logs in the sandbox's /.nook.
func generateSpec(sb *core.Sandbox, agentBinary, cgroupParent, netns, userns string, m idmap) (*specs.Spec, error) {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG=C.UTF-8",
		"TERM=xterm-256color",
		"NOOK_AGENT_LISTEN=" + agentSocketInSandbox,
		"NOOK_AGENT_LOG=" + agentLogInSandbox,
		"NOOK_SANDBOX=" + sb.Name,
	}
	keys := make([]string, 0, len(sb.Env))
	for k := range sb.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+sb.Env[k])
	}
	caps := append([]string(nil), defaultCaps...)
	memLimit := sb.MemoryBytes
	pids := sb.PidsLimit
	period := uint64(100000)
	quota := int64(sb.CPUs * float64(period))
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: []string{agentPathInSandbox},
			Env:  env,
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits: []specs.POSIXRlimit{nofile()},
		},
		Root:     &specs.Root{Path: "rootfs"},
		Hostname: sb.Name,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: agentPathInSandbox, Type: "bind", Source: agentBinary, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/" + cgroupParent + "/" + sb.ID,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &memLimit},
				CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids:    &specs.LinuxPids{Limit: &pids},
			},
			Sysctl: map[string]string{"net.ipv4.ping_group_range": pingGroupRange},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
				// The sandbox's own network namespace (loopback, and the
				// interface the network manager gives it): never the host's.
				{Type: specs.NetworkNamespace, Path: netns},
			},
			// moby's defaults: what tells about the host's hardware, kernel
			// memory and other tenants' timers and keys.
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
				"/proc/scsi", "/sys/devices/virtual/powercap",
			},
			ReadonlyPaths: []string{
				"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
			},
		},
	}
	if quota <= 0 {
		s.Linux.Resources.CPU = nil
	}
	if m.enabled() {
		// Root inside is base on the host (userns.go); the network
		// namespace belongs to this user namespace.
		mapping := []specs.LinuxIDMapping{{ContainerID: 0, HostID: m.Base, Size: idRangeSize}}
		s.Linux.UIDMappings, s.Linux.GIDMappings = mapping, mapping
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace, Path: userns})
		s.Linux.Sysctl["net.ipv4.ping_group_range"] = pingGroupRangeUserns
	}
	sc, err := seccomp.GetDefaultProfile(s)
	if err != nil {
		return nil, fmt.Errorf("default seccomp profile: %w", err)
	}
	// Native syscalls only: a 32-bit (i386, x32) syscall kills the process.
	// The 32-bit ABIs are a classic way around a filter, and leaving them out
	// makes runc compile the filter in half the time.
	sc.Architectures = []specs.Arch{specs.ArchX86_64}
	s.Linux.Seccomp = sc
	return s, nil
}

// nofile raises the open-files limit to the daemon's own hard limit: the
// sandbox's capability set lacks CAP_SYS_RESOURCE, so it cannot go higher.
func nofile() specs.POSIXRlimit {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Max == 0 {
		rl.Max = 1024
	}
	return specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Hard: rl.Max, Soft: rl.Max}
}
