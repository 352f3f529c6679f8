package client

import (
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// breakWorthWatching reports whether a stream that ended with err before
// its last event may be resumed by watching the run: the transport broke
// (UNAVAILABLE, or an end without a status), or the server said the log or
// the run's replica is unavailable for now.
func breakWorthWatching(err error) bool {
	if err == io.EOF {
		return true
	}
	f := fromStatus(err)
	return f.transport || (f.retry && f.err.Code == turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE)
}

// noRun reports whether a WatchTurn failed because there is no run to
// watch: the server keeps no log (FAILED_PRECONDITION), predates
// WatchTurn (UNIMPLEMENTED), or never stored the run (NOT_FOUND).
func noRun(err error) bool {
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.Unimplemented, codes.NotFound:
		return true
	}
	return false
}
