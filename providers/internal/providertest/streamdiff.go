package providertest

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/llm"
)

// Stream is what one call of a provider's stream yielded: its chunks and
// the error that ended it, if any.
type Stream struct {
	Chunks []llm.Chunk
	Err    error
}

// StreamDiff describes how what a fast decoder yielded (fast) differs
// from what its SDK yielded for the same body (sdk): the chunks, the
// classified errors (compared without their Err) and the text of the
// errors they wrap. It returns "" when they are the same.
func StreamDiff(sdk, fast Stream) string {
	var out []string
	if diff := cmp.Diff(sdk.Chunks, fast.Chunks); diff != "" {
		out = append(out, "chunks differ (-sdk +fast):\n"+diff)
	}
	if (sdk.Err == nil) != (fast.Err == nil) {
		return strings.Join(append(out, fmt.Sprintf("errors differ: sdk %v, fast %v", sdk.Err, fast.Err)), "\n")
	}
	if sdk.Err == nil {
		return strings.Join(out, "\n")
	}
	var se, fe *llm.Error
	if !errors.As(sdk.Err, &se) || !errors.As(fast.Err, &fe) {
		return strings.Join(append(out, fmt.Sprintf("errors are not *llm.Error: sdk %v, fast %v", sdk.Err, fast.Err)), "\n")
	}
	if diff := cmp.Diff(se, fe, IgnoreErr); diff != "" {
		out = append(out, "errors differ (-sdk +fast):\n"+diff)
	}
	if (se.Err == nil) != (fe.Err == nil) || se.Err != nil && se.Err.Error() != fe.Err.Error() {
		out = append(out, fmt.Sprintf("causes differ: sdk %v, fast %v", se.Err, fe.Err))
	}
	return strings.Join(out, "\n")
}
