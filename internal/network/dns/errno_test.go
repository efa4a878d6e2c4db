package dns

import "syscall"

var syscall_EADDRINUSE = syscall.EADDRINUSE
