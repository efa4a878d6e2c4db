// Command nook is the nook CLI, and the daemon as `nook serve`.
package main

import (
	"os"

	"github.com/nookhq/nook/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
