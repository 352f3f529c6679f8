package main

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// defaultGOGC is the server's GOGC when the operator sets none. A turn
// allocates some 50 KB that is garbage once it ends, over a live heap of a
// few MB: at Go's default of 100 the collector runs every few dozen turns.
// 400 runs it a quarter as often, for a heap that peaks a few MB higher.
const defaultGOGC = 400

// memoryLimitShare is the share of the container's memory limit the heap
// may use before the collector works harder (GOMEMLIMIT), so that a high
// GOGC cannot take the process past its limit.
const memoryLimitShare = 0.9

// cgroupMemoryMax is where cgroup v2 publishes the container's limit.
const cgroupMemoryMax = "/sys/fs/cgroup/memory.max"

// gcSettings returns the collector settings the server applies: GOGC
// defaultGOGC unless the operator set GOGC, and a memory limit of
// memoryLimitShare of the container's limit (memoryMax, the contents of
// cgroup's memory.max) unless the operator set GOMEMLIMIT or there is no
// limit. Zero values mean "leave alone".
func gcSettings(getenv func(string) string, memoryMax string) (gogc int, memLimit int64) {
	if getenv("GOGC") == "" {
		gogc = defaultGOGC
	}
	if getenv("GOMEMLIMIT") == "" {
		if n, err := strconv.ParseInt(strings.TrimSpace(memoryMax), 10, 64); err == nil && n > 0 {
			memLimit = int64(float64(n) * memoryLimitShare)
		}
	}
	return gogc, memLimit
}

// setGCDefaults applies [gcSettings] to the running process.
func setGCDefaults() {
	memMax, _ := os.ReadFile(cgroupMemoryMax)
	gogc, limit := gcSettings(os.Getenv, string(memMax))
	if gogc > 0 {
		debug.SetGCPercent(gogc)
	}
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
}
