// Command pages reports which pages of a running process's executable are
// resident, and whose: by mapping, by ELF section, `.text` by module and
// `.gopclntab` by table, and how many of each mapping's aligned 64 KiB
// windows have a resident page, and how many all of theirs (the kernel
// maps a file's cached pages around a fault, `fault_around_bytes`, 64 KiB
// by default). It reads /proc/PID/maps and /proc/PID/pagemap (bit 63: the
// page is mapped into the process, which is what Rss counts) and, when
// readable (root), /proc/kpageflags for the large folios of the page cache
// behind them. Linux only:
//
//	go run ./internal/pages -pid PID
//
// BENCHMARKS.md ("Idle resident memory") records results and how they were
// taken.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	pid := flag.Int("pid", 0, "the process to look at")
	top := flag.Int("top", 20, "modules listed by their resident .text")
	flag.Parse()
	if *pid <= 0 {
		fmt.Fprintln(os.Stderr, "pages: -pid is required")
		os.Exit(2)
	}
	r, err := measure(*pid)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pages: %v\n", err)
		os.Exit(1)
	}
	r.print(os.Stdout, *top)
}
