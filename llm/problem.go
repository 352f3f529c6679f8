package llm

// Problem is a setting that is out of range, as the Problems methods of
// settings types report it (policy.Retry, runtime.Limits, a provider's
// settings). Field is the setting's yaml name within its block; the
// configuration adds the block's path and the line. Message never quotes
// a value that may be secret.
type Problem struct {
	Field   string
	Message string
}

// Error returns "Field: Message".
func (p Problem) Error() string { return p.Field + ": " + p.Message }
